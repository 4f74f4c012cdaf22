"""Reports: HTML with embedded plots, Markdown summary, run comparison."""
