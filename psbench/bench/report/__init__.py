"""Reports: a suite's records read with pandas, statistics, plots, report.md/html."""
