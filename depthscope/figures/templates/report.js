// The report's charts: REPORT (data entries, Vega-Lite specs) in, one vegaEmbed view per chart out.
// The body's data-status says what happened, for people and for the browser test:
// data-charts="drawn/total", data-errors (script errors and failed charts), data-warnings (Vega's
// console warnings: a log domain that includes zero draws empty axes and only warns),
// data-status="ready"; each chart's element gets data-marks, the items its marks drew,
// data-clipped, the points drawn past the edge of their plot (cut in half by the plot's clip), and
// data-nonfinite, the items at a position that is not a finite number (drawn nowhere).
(function () {
  var errors = [];
  var body = document.body;
  function report(msg) {
    errors.push(String(msg));
    body.setAttribute('data-errors', String(errors.length));
    body.setAttribute('data-last-error', String(msg).slice(0, 300));
  }
  window.addEventListener('error', function (e) { report(e.message || e); });
  window.addEventListener('unhandledrejection', function (e) { report(e.reason); });
  var consoleError = console.error;
  console.error = function () {
    report(Array.prototype.join.call(arguments, ' '));
    consoleError.apply(console, arguments);
  };
  body.setAttribute('data-errors', '0');
  var warnings = 0;
  var consoleWarn = console.warn;
  console.warn = function () {
    warnings += 1;
    body.setAttribute('data-warnings', String(warnings));
    body.setAttribute('data-last-warning', Array.prototype.join.call(arguments, ' ').slice(0, 300));
    consoleWarn.apply(console, arguments);
  };
  body.setAttribute('data-warnings', '0');

  function marks(node) {  // the items drawn by a view's data marks (not its axes, legends or frame)
    var n = 0;
    (node.items || []).forEach(function (item) {
      if (item.marktype) {
        if (item.role === 'mark' && item.marktype !== 'group') n += (item.items || []).length;
        else n += marks(item);
      } else if (item.items) {
        n += marks(item);
      }
    });
    return n;
  }

  // the items of a view's data marks that drew nowhere or half: points (symbols) whose extent leaves
  // their plot area (cut by the plot's clip), and items of any mark at a non-finite position
  function faults(node, width, height, out) {
    (node.items || []).forEach(function (item) {
      if (item.marktype === 'group') {
        (item.items || []).forEach(function (g) {
          faults(g, g.width != null ? g.width : width, g.height != null ? g.height : height, out);
        });
      } else if (item.marktype && item.role === 'mark') {
        (item.items || []).forEach(function (p) {
          var xy = [p.x, p.y, p.x2, p.y2, p.width, p.height].filter(function (v) { return v != null; });
          if (xy.some(function (v) { return !isFinite(v); })) out.nonfinite += 1;
          var b = p.bounds;
          if (item.marktype === 'symbol' && b &&
              (b.x1 < -0.5 || b.y1 < -0.5 || b.x2 > width + 0.5 || b.y2 > height + 0.5)) out.clipped += 1;
        });
      } else if (item.items) {
        faults(item, width, height, out);
      }
    });
    return out;
  }

  function rows(entry) {  // columns (labels as dictionary + indices) -> row objects
    var cache = entry.__rows;
    if (cache) return cache;
    var names = Object.keys(entry.columns), out = new Array(entry.n);
    for (var r = 0; r < entry.n; r++) {
      var row = {};
      for (var k = 0; k < names.length; k++) {
        var col = entry.columns[names[k]];
        row[names[k]] = col.dict ? col.dict[col.idx[r]] : col[r];
      }
      out[r] = row;
    }
    entry.__rows = out;
    return out;
  }

  var views = [];
  var drawn = 0;
  var total = REPORT.charts.length;
  body.setAttribute('data-charts', '0/' + total);
  var jobs = REPORT.charts.map(function (chart) {
    var spec = chart.spec;
    spec.data = {values: rows(REPORT.data[chart.data])};
    spec.config = {view: {stroke: '#ddd'}, axis: {labelFontSize: 10, titleFontSize: 11}};
    var el = document.getElementById(chart.id);
    if (!el) { report('no element for chart ' + chart.id); return Promise.resolve(); }
    return vegaEmbed(el, spec, {actions: false, renderer: 'canvas', mode: 'vega-lite'})
      .then(function (res) {
        views.push({chart: chart, view: res.view});
        drawn += 1;
        el.setAttribute('data-drawn', '1');
        var root = res.view.scenegraph().root;
        el.setAttribute('data-marks', String(marks(root)));
        var bad = faults(root, res.view.width(), res.view.height(), {clipped: 0, nonfinite: 0});
        el.setAttribute('data-clipped', String(bad.clipped));
        el.setAttribute('data-nonfinite', String(bad.nonfinite));
        body.setAttribute('data-charts', drawn + '/' + total);
      })
      .catch(function (err) { report('chart ' + chart.id + ': ' + (err && err.message || err)); });
  });

  // the model selector: one model's section shown, and every chart that follows it switched
  var select = document.getElementById('model-select');
  function pick(model) {
    var sections = document.querySelectorAll('section[data-model]');
    for (var i = 0; i < sections.length; i++) {
      sections[i].hidden = sections[i].getAttribute('data-model') !== model;
    }
    views.forEach(function (v) {
      if (v.chart.follows && REPORT.data[v.chart.data].labels[model]) {
        v.view.signal('pick', model).runAsync();
      }
    });
  }
  if (select) {
    select.addEventListener('change', function () { pick(select.value); });
  }
  Promise.all(jobs).then(function () {
    if (select && select.value) pick(select.value);
    body.setAttribute('data-status', 'ready');
  });
})();
