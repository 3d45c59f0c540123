"""The console's chart colours, one home for every page's figures: a series looks the same wherever it is drawn.
Each feature builds its own figures beside its code (core/monitor/charts.py, diagnostics/charts.py, ...)."""

LINE_COLOURS = ("#76b900", "#4aa3ff", "#ffb020", "#c678dd", "#e6463c", "#56d4c8")
