"""Tables, plots and an HTML report from the results benchmark_kimi.yml lands.

    python -m analysis report results/<run_id> [--out DIR]
    python -m analysis compare results/<run_a> results/<run_b> [--out DIR]

From Python: analysis.report(results_dir, out=None) and analysis.compare(run_a, run_b),
each returning an Outcome (the output folder, the summary rows, the recommendation and the
warnings), or raising ResultsError (every problem with the results, each naming the file and
the field) or OutputError (the output folder cannot be used; nothing is written then).
"""

# The kit's module_utils/ as ansible.module_utils.<stage> (module_utils/__init__.py): the
# analysis reads the contract (module_utils/contract/) the writer writes by.
import module_utils  # noqa: F401
from analysis.output import Outcome, OutputError
from analysis.report import report
from analysis.report_compare import compare
from analysis.results import ResultsError, load

__all__ = ["Outcome", "OutputError", "ResultsError", "compare", "load", "report"]
