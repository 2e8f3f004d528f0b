"""The report: `dsdbed analyze` (points.csv, summary.json), the plots, `dsdbed report` (HTML), and
the geography matrix."""
