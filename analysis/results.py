"""Reading and validating a results tree: level files, losslessness reports, config status.

The layout benchmark_kimi.yml lands on the controller is

    <run>/run.json
    <run>/<host>/lossless.json
    <run>/<host>/<config>/status.json
    <run>/<host>/<config>/<prompt set>/c<N>.json

Any folder above or inside that works (a run, one host's folder, several runs' parent as
long as no level appears twice). Config and prompt set come from each file's own fields; the
host from the folder above the config's, else `provenance.host`, else the folder analysed.

Speed: a level file holds every request's record (events, text, token ids) and is mostly
that; parsing all of it with the json module runs at about 80 MB/s, too slow for 100,000
records. Files in the layout the benchmark module writes (indent 1, `requests` last) are read
in two parts: everything but the requests with json, and the four per-request fields the
analysis uses (index, ok, output_tokens, accept_length) with one regular expression over the
requests. Anything unexpected in that part (a missing field, a value of the wrong type, a
count that does not add up, another layout) falls back to a full parse, which also produces
the precise message. `strict=True` parses every file in full. Files are read in parallel.

The contract is docs/schema/level.schema.json (JSON Schema draft 2020-12, written by `make
schema` from module_utils/contract/level_schema.py), the same file the writer's tests
validate against: every level file's top level, summary and the rest but its
request records are validated against it; the request records too under `strict=True`
(the four fields above are checked either way). What the schema cannot say stays here: the
file name agrees with `concurrency`, the counts add up, one schema version per tree, one
file per level, no NaN or Infinity (not JSON) and no number past MAX_MAGNITUDE, nesting
bounded. On top of the schema the analysis types the provenance fields it reads and keeps
latencies at least 0 (tightened()); run.json, lossless.json and status.json are held to the
fields it reads (RUN_SCHEMA, ...). Every problem is one 'file: field: what' line.

Only regular files (or links to one) are read, each at most max_file_bytes (2 GiB unless
raised): a link to /dev/zero, a FIFO, a socket or a device is refused by name (read_regular).

This module is where the rest of the analysis reads the results from; the code lives in

    results_types      Results, Level, ResultsError
    results_tree       load(): finding the files, reading the levels in parallel, the checks
                       across files (one schema version, one file per level)
    results_level      one level file: the fast reader and the full parse
    results_reduce     a level's checks beyond the schema, reduced to what the analysis keeps
    results_schema     the level schema, tightened and compiled, its errors worded
    results_side       run.json, lossless.json, status.json, api-check.json; run.json's model
    results_read       reading one regular file of bounded size, parsing it, its syntax errors
    results_values     finite numbers, bounded nesting, values and paths worded for messages
    provenance         a level's reduced provenance; its TP size, DDTree budget, verify width
    incomplete_run     the configs and levels run.json plans that left no file
"""

from __future__ import annotations

from ansible.module_utils.contract.launch import flag_value
from ansible.module_utils.contract.level import SUPPORTED_SCHEMAS
from ansible.module_utils.contract.names import (
    CHAIN_CONTROL,
    MAX_TP,
    base_config,
    config_order,
)
from ansible.module_utils.contract.names import read_config_name as parse_config_name

from analysis.incomplete_run import MAX_LISTED, incomplete
from analysis.provenance import (
    MAX_COUNT,
    ddtree_budget,
    reduce_provenance,
    tp_size,
    verify_tokens_per_step,
)
from analysis.results_level import read_level
from analysis.results_read import DEFAULT_MAX_FILE_BYTES, read_regular
from analysis.results_reduce import MAX_PROMPT_TOKENS, accuracy_problems
from analysis.results_schema import (
    LEVEL_SCHEMA,
    contract_problems,
    level_validator,
    schema_problems,
    tightened,
)
from analysis.results_side import (
    API_CHECK_SCHEMA,
    LOSSLESS_SCHEMA,
    RUN_SCHEMA,
    SIDE_FIX,
    STATUS_SCHEMA,
    accuracy_floors,
    model_title,
    read_small,
    run_model,
    side_validator,
)
from analysis.results_tree import (
    API_CHECK_BYTES,
    MAX_DEPTH,
    MAX_FILES,
    PARALLEL_BYTES,
    REPORT_JSON_BYTES,
    REPORT_KIND,
    discover,
    is_report_dir,
    load,
)
from analysis.results_types import MAX_PROBLEMS, Level, Results, ResultsError
from analysis.results_values import MAX_MAGNITUDE, MAX_NESTING, number_problems, ratio

__all__ = [
    "API_CHECK_BYTES",
    "API_CHECK_SCHEMA",
    "CHAIN_CONTROL",
    "DEFAULT_MAX_FILE_BYTES",
    "LEVEL_SCHEMA",
    "LOSSLESS_SCHEMA",
    "MAX_COUNT",
    "MAX_DEPTH",
    "MAX_FILES",
    "MAX_LISTED",
    "MAX_MAGNITUDE",
    "MAX_NESTING",
    "MAX_PROBLEMS",
    "MAX_PROMPT_TOKENS",
    "MAX_TP",
    "PARALLEL_BYTES",
    "REPORT_JSON_BYTES",
    "REPORT_KIND",
    "RUN_SCHEMA",
    "SIDE_FIX",
    "STATUS_SCHEMA",
    "SUPPORTED_SCHEMAS",
    "Level",
    "Results",
    "ResultsError",
    "accuracy_floors",
    "accuracy_problems",
    "base_config",
    "config_order",
    "contract_problems",
    "ddtree_budget",
    "discover",
    "flag_value",
    "incomplete",
    "is_report_dir",
    "level_validator",
    "load",
    "model_title",
    "number_problems",
    "parse_config_name",
    "ratio",
    "read_level",
    "read_regular",
    "read_small",
    "reduce_provenance",
    "run_model",
    "schema_problems",
    "side_validator",
    "tightened",
    "tp_size",
    "verify_tokens_per_step",
]
