"""The console's chart colours, one home for every page's figures: a series looks the same wherever it is drawn.
Each feature builds its own figures beside its code (core/monitor/charts.py, diagnostics/charts.py, ...)."""

# Eight, so each GPU of an 8-GPU host has its own line.
LINE_COLOURS = ("#76b900", "#4aa3ff", "#ffb020", "#c678dd", "#e6463c", "#56d4c8", "#ff7eb6", "#a8a8a8")
