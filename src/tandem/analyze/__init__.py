"""Reading the run store: statistics, diagnosis, the HTML report and run comparison.

Entry points: `tandem.analyze.diagnosis.diagnose.diagnose`, `tandem.analyze.report.run_report.write_html`,
`print_summary`, `compare` and `compare_table` (also in `report`). The functions named
like their modules (`diagnose`, `compare`) are not re-exported here, so that
`tandem.analyze.diagnosis.diagnose` stays the module.
"""

from tandem.analyze.diagnosis.diagnose import Finding, verdict
from tandem.analyze.report.run_report import compare_table, print_summary, write_html

__all__ = ["Finding", "compare_table", "print_summary", "verdict", "write_html"]
