"""Reading the run store: statistics, diagnosis, the HTML report and run comparison.

Entry points: `tandem.analyze.diagnose.diagnose`, `tandem.analyze.report.write_html`,
`print_summary`, `compare` and `compare_table` (also in `report`). The functions named
like their modules (`diagnose`, `compare`) are not re-exported here, so that
`tandem.analyze.diagnose` stays the module.
"""

from tandem.analyze.diagnose import Finding, verdict
from tandem.analyze.report import compare_table, print_summary, write_html

__all__ = ["Finding", "compare_table", "print_summary", "verdict", "write_html"]
