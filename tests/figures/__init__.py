def planned_figures(traces, k: int = 2, trajectories=()):
    """(description, function drawing the Figure) of every figure of a report of ``traces``."""
    from depthscope.pipelines.report_data import report_data
    from depthscope.pipelines.report_settings import ReportSettings

    data, _ = report_data(list(traces), list(trajectories), ReportSettings(k=k))
    return [(f.spec, f.draw) for f in data.figures()]
