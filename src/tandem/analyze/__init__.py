"""Reading the run store: statistics, diagnosis, the HTML report and run comparison.

Three subpackages: `diagnosis` (findings and the verdict), `scaling` (efficiency measured,
throughput predicted at other sizes) and `report` (the HTML report, the terminal summary,
runs side by side); `stats`, `text` and `synthetic` serve all three. Entry points:
`verdict`, `write_html`, `print_summary` and `compare_table`, re-exported here.
"""

from tandem.analyze.diagnosis.diagnose import Finding, verdict
from tandem.analyze.report.run_report import compare_table, print_summary, write_html

__all__ = ["Finding", "compare_table", "print_summary", "verdict", "write_html"]
