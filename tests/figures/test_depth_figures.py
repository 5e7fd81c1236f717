"""The versus-depth figure draws the table's numbers, and the report gets its section."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from depthscope.analysis.depth import depth_table
from depthscope.figures.depth import depth_figure, plot_versus_depth
from tests.analysis.test_depth import model


def test_each_group_is_a_line_of_its_values():
    table = depth_table(
        [
            model("standard", 1, 5, 2.0),
            model("standard", 2, 5, 1.9),
            model("dca", 1, 5, 1.8),
            model("dca", 2, 5, 1.5),
        ]
    )
    fig, ax = plt.subplots()
    assert plot_versus_depth(table, ax, var="loss_gain") is ax
    lines = {line.get_label(): line.get_ydata() for line in ax.lines}
    np.testing.assert_allclose(lines["dca"], [0.2, 0.4])
    fig2 = depth_figure(table)
    assert len(fig2.axes) == 8 and any(line.get_label() == "dca q" for line in fig2.axes[6].lines)
    plt.close("all")
