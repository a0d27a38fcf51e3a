"""The launch rules of module_utils/plan/sglang_args.py: the checks SGLang makes when it starts
that need no model config, each a function over the parsed values (argparse destinations), and
what a runtime forces whatever argv says. They run on the snapshot-built parser's namespace
(plans, the simulator) and, at deploy time, on the values the installed runtime's own parser
produced (module_utils/server/launch_check.py). A contract names which of them apply: the
release's (RELEASE_RULES), plus those its overlay lists (sglang_args.load_contract).

Standard library only, and nothing from the kit: sglang_args.py imports it, and where that file
is copied (into the stand-in sglang, tests/support/fake_sglang.py) this one goes beside it.
"""

from __future__ import annotations


class ArgvError(ValueError):
    """A launch command the pinned SGLang would refuse; `flag` names the offending option."""

    def __init__(self, message: str, flag: str | None = None):
        super().__init__(message)
        self.flag = flag


# Checks the pinned release makes at launch without reading any model config
# (python/sglang/srt/arg_groups/speculative_hook.py handle_speculative_decoding, _handle_dflash).
RELEASE_RULES = (
    "speculative-algorithm-known",
    "draft-window-positive",
    "draft-sink-size",
    "dflash-needs-drafter",
    "dflash-pp-size-1",
    "dflash-block-size",
    "dflash-window-covers-block",
)


# --- launch-time rules that need no model config -----------------------------------------
#
# Each rule takes the parsed values (argparse destinations) and a context (the runtime's
# label, the algorithms it knows, the DFlash family) and yields ArgvError.

_DFLASH_FAMILY = {"DFLASH"}


def _algorithm(values: dict) -> str | None:
    algorithm = values.get("speculative_algorithm")
    return algorithm.upper() if isinstance(algorithm, str) else None


def _rule_algorithm_known(values: dict, ctx: dict):
    algorithm = _algorithm(values)
    known = ctx.get("algorithms")
    if algorithm is None or known is None or algorithm in known:
        return
    yield ArgvError(
        f"{ctx['label']} does not know --speculative-algorithm {values['speculative_algorithm']} "
        f"(it knows {', '.join(sorted(known))}); an algorithm that is not in this "
        "release needs SGLang installed from a git ref that has it",
        "--speculative-algorithm",
    )


def _rule_window_positive(values: dict, ctx: dict):
    window = values.get("speculative_draft_window_size")
    if window is not None and window <= 0:
        yield ArgvError(
            f"--speculative-draft-window-size must be positive, got {window}",
            "--speculative-draft-window-size",
        )


def _rule_sink(values: dict, ctx: dict):
    sink = values.get("speculative_draft_sink_size")
    if sink is None:
        return
    if sink < 0:
        yield ArgvError(
            f"--speculative-draft-sink-size must be non-negative, got {sink}",
            "--speculative-draft-sink-size",
        )
    elif values.get("speculative_draft_window_size") is None:
        yield ArgvError(
            "--speculative-draft-sink-size requires --speculative-draft-window-size",
            "--speculative-draft-sink-size",
        )


def _dflash_like(values: dict, ctx: dict) -> bool:
    return _algorithm(values) in ctx["dflash_family"]


def _rule_dflash_drafter(values: dict, ctx: dict):
    if _dflash_like(values, ctx) and values.get("speculative_draft_model_path") is None:
        yield ArgvError(
            f"{_algorithm(values)} speculative decoding requires --speculative-draft-model-path",
            "--speculative-draft-model-path",
        )


def _rule_dflash_pp(values: dict, ctx: dict):
    pp = values.get("pp_size")
    if _dflash_like(values, ctx) and pp is not None and pp != 1:
        yield ArgvError(
            f"{_algorithm(values)} speculative decoding only supports --pp-size 1, got {pp}",
            "--pp-size",
        )


def _rule_dflash_block(values: dict, ctx: dict):
    if not _dflash_like(values, ctx):
        return
    block = values.get("speculative_dflash_block_size")
    tokens = values.get("speculative_num_draft_tokens")
    if block is None:
        return
    if block <= 0:
        yield ArgvError(
            f"DFLASH requires --speculative-dflash-block-size to be positive, got {block}",
            "--speculative-dflash-block-size",
        )
    elif tokens is not None and tokens != block:
        yield ArgvError(
            "--speculative-num-draft-tokens and --speculative-dflash-block-size differ "
            f"({tokens} and {block}); for {_algorithm(values)} they must match",
            "--speculative-dflash-block-size",
        )


def _block_size(values: dict) -> int | None:
    tokens = values.get("speculative_num_draft_tokens")
    return tokens if tokens is not None else values.get("speculative_dflash_block_size")


def _rule_dflash_window(values: dict, ctx: dict):
    if not _dflash_like(values, ctx):
        return
    # Without either size SGLang reads the block size from the drafter's config, which is
    # not known here, so the window check is left to the server.
    window = values.get("speculative_draft_window_size")
    size = _block_size(values)
    if window is not None and size is not None and 0 < window < size:
        yield ArgvError(
            "--speculative-draft-window-size must be >= --speculative-num-draft-tokens "
            f"(block size): window {window}, block size {size}",
            "--speculative-draft-window-size",
        )


# DDTree (SGLang pull request 29907, python/sglang/srt/arg_groups/speculative_hook.py
# _handle_ddtree). Its rules apply only where a contract's overlay lists them.


def _is_ddtree(values: dict) -> bool:
    return _algorithm(values) == "DDTREE"


def _rule_ddtree_budget(values: dict, ctx: dict):
    budget = values.get("speculative_ddtree_budget")
    if _is_ddtree(values) and budget is not None and budget < 1:
        yield ArgvError(
            f"--speculative-ddtree-budget must be >= 1, got {budget}",
            "--speculative-ddtree-budget",
        )


def _rule_ddtree_rejection_sampling(values: dict, ctx: dict):
    if _is_ddtree(values) and values.get("speculative_use_rejection_sampling"):
        yield ArgvError(
            "DDTREE does not support --speculative-use-rejection-sampling; leave it out "
            "(DDTree verifies with target-only sampling)",
            "--speculative-use-rejection-sampling",
        )


def _rule_ddtree_page_size(values: dict, ctx: dict):
    if not _is_ddtree(values):
        return
    page = values.get("page_size")
    if page is None:
        # Kit rule, stricter than the pull request: left out, the page size is chosen from
        # the attention backend, and only a resolved 1 passes the pull request's check.
        yield ArgvError(
            "DDTREE requires page size 1; pass --page-size 1 (left out, SGLang picks the "
            "page size from the attention backend)",
            "--page-size",
        )
    elif page != 1:
        yield ArgvError(
            f"DDTREE supports only --page-size 1, got {page}",
            "--page-size",
        )


def _rule_ddtree_full_tree_triton(values: dict, ctx: dict):
    if not _is_ddtree(values):
        return
    budget = values.get("speculative_ddtree_budget")
    if budget is None:
        return  # the budget defaults to block size - 1: a chain (spine mode), any backend
    block = _block_size(values)
    if block is None:
        # Kit rule: whether the tree is a chain or a full tree depends on the block size,
        # which SGLang would otherwise read from the drafter's config.
        yield ArgvError(
            "DDTREE with --speculative-ddtree-budget needs --speculative-num-draft-tokens "
            "(the DFlash drafter's block size) to tell a chain from a full tree; pass it",
            "--speculative-num-draft-tokens",
        )
        return
    if budget <= block - 1:
        return
    attention = values.get("attention_backend")
    for flag, dest in (
        ("--prefill-attention-backend", "prefill_attention_backend"),
        ("--decode-attention-backend", "decode_attention_backend"),
    ):
        backend = values.get(dest) or attention
        if backend != "triton":
            used = flag if values.get(dest) else "--attention-backend"
            shown = backend if backend is not None else "left to SGLang's choice"
            yield ArgvError(
                f"DDTREE full-tree mode (budget {budget} > block size {block} - 1) verifies "
                f"budget + 1 tokens per request and supports only the triton attention "
                f"backend; {dest.split('_')[0]} attention is {shown}: pass "
                "--attention-backend triton",
                used,
            )
            return


RULES = {
    "speculative-algorithm-known": _rule_algorithm_known,
    "draft-window-positive": _rule_window_positive,
    "draft-sink-size": _rule_sink,
    "dflash-needs-drafter": _rule_dflash_drafter,
    "dflash-pp-size-1": _rule_dflash_pp,
    "dflash-block-size": _rule_dflash_block,
    "dflash-window-covers-block": _rule_dflash_window,
    # A marker: with it, the DFlash rules above apply to DDTREE too.
    "ddtree-inherits-dflash": lambda values, ctx: iter(()),
    "ddtree-budget-positive": _rule_ddtree_budget,
    "ddtree-no-rejection-sampling": _rule_ddtree_rejection_sampling,
    "ddtree-page-size-1": _rule_ddtree_page_size,
    "ddtree-full-tree-triton": _rule_ddtree_full_tree_triton,
}


def _force_overlap_off(values: dict) -> None:
    values["disable_overlap_schedule"] = True


def _default_ddtree_budget(values: dict) -> None:
    tokens = values.get("speculative_num_draft_tokens")
    if values.get("speculative_ddtree_budget") is None and tokens is not None:
        values["speculative_ddtree_budget"] = int(tokens) - 1


# What the pull request sets itself at launch, whatever argv says (applied by the simulator
# and the test runtimes' parser; a plan records it).
FORCED = {
    "ddtree-overlap-schedule-off": _force_overlap_off,
    "ddtree-budget-default": _default_ddtree_budget,
}


def resolve_forced(values: dict, contract: dict) -> dict:
    """values with what the contract's runtime forces for the algorithm (a copy)."""
    values = dict(values)
    if _is_ddtree(values):
        for rule_id in contract.get("forced") or []:
            FORCED[rule_id](values)
    return values


def launch_rule_errors(
    values: dict,
    rule_ids=None,
    *,
    label: str = "this SGLang",
    algorithms=None,
) -> list[ArgvError]:
    """Every config-free launch rule of rule_ids (default: the release's) that values break.

    algorithms: the speculative algorithm names the runtime knows (upper case), or None when
    the runtime itself was asked (deploy time) and the name check is not repeated here.
    An unknown algorithm stops the checks: the others are about algorithms the runtime has.
    """
    ids = list(RELEASE_RULES if rule_ids is None else rule_ids)
    family = set(_DFLASH_FAMILY)
    if "ddtree-inherits-dflash" in ids:
        family.add("DDTREE")
    ctx = {"label": label, "algorithms": algorithms, "dflash_family": family}
    errors: list[ArgvError] = []
    for rule_id in ids:
        found = list(RULES[rule_id](values, ctx))
        errors += found
        if rule_id == "speculative-algorithm-known" and found:
            break
    return errors


def contract_algorithms(contract: dict) -> set[str] | None:
    """The speculative algorithm names the contract's runtime knows, None where it lists none."""
    algorithms = contract.get("speculative_algorithms")
    if not algorithms:
        return None
    return (
        set(algorithms.get("builtin", []))
        | set(algorithms.get("aliases", {}))
        | set(algorithms.get("registered_plugins", []))
    )
