#!/usr/bin/env python3
"""tools/feature_matrix.py — the feature matrix's one source: its dimensions, the all-pairs selection, the combinations file the test reads, and the compatibility table written from the test's outcomes.

  feature_matrix.py write            writes tests/matrix/combinations.txt
  feature_matrix.py check            exits 1 when that file is not what `write` would write
  feature_matrix.py table OUTCOMES…  writes docs/feature_matrix.md from the test's outcome files
                                     (build/tests/matrix/outcomes_np*.txt)

Every combination either steps bitwise like the plain reference run of the same program
(overlap off, stage 1, flat, node sharing off: the implementation dimensions at their first
value, the semantic ones as the combination has them, same world size) or is refused by name
on every rank: by a constructor, or (a combination a call makes, such as join() beside model
averaging) by that call and the calls that meet it, never by a timeout. A combination marked known failing below does neither today:
the test runs it and asserts it still fails the same way, so a fix shows up as a test failure
that asks for the mark to go.
"""
import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMBINATIONS = os.path.join(ROOT, "tests", "matrix", "combinations.txt")
TABLE = os.path.join(ROOT, "docs", "feature_matrix.md")

# Implementation choices: must not change the results. The first value is the reference's.
IMPLEMENTATION = [
    ("overlap", ["off", "after_backward", "per_bucket"]),
    ("stage", ["1", "2"]),
    ("partition", ["flat", "sorted_greedy"]),
    # off: node_shared_params false; on: every rank of the machine one node; uneven: nodes of
    # ranks_per_node ranks that do not divide the world (2 at np 3, 3 at np 4); pairs: nodes of 2
    # at np 4 (the hierarchical reduction: each node's share summed over its slots, then across
    # the nodes).
    ("nodes", ["off", "on", "uneven", "pairs"]),
]
# Program semantics: the reference runs the same.
SEMANTICS = [
    ("dtype", ["f32", "bf16"]),
    # replicas1: post-local SGD over one-rank replicas (period 2, no warmup); replicas2: over
    # two-rank replicas (period 2, warmup 1); outer: one-rank replicas with the outer optimizer.
    ("local_sgd", ["off", "replicas1", "replicas2", "outer"]),
    # on: even world ranks train 3 batches, odd ones 5, then each calls join().
    ("join", ["off", "on"]),
    # After step 1 (every rank); the second half (wait_save, thaw) after step 2.
    ("mid_op", ["none", "save_load", "save_async", "consolidate", "set_trainable", "add_param_group"]),
    ("lr_change", ["no", "yes"]),  # every group's lr halved before step 2
    # Each group's algorithm: adamw (amsgrad) in both groups, sgd (momentum 0.9), adam (amsgrad);
    # muon_mixed: the first group Muon over matrices ([37,1], [8,8], [5,1]), the second AdamW.
    ("algorithm", ["adamw", "sgd", "adam", "muon_mixed"]),
    # The second group's state: fp32; q8 (8-bit blockwise moments, amsgrad off in that group,
    # which 8-bit state has no form for); compact (q8 and master = remainder16). With either, the
    # second group holds one more param of 4100 elements (q8 quantises params of 4096 and more), and
    # the reference partitions sorted_greedy (q8 blocks stay whole on one rank; flat is refused).
    ("state", ["fp32", "q8", "compact"]),
]
WORLD = [("np", ["2", "3", "4"])]
DIMENSIONS = WORLD + IMPLEMENTATION + SEMANTICS


def valid(assignment):
    """Whether a (partial) assignment {dimension: value} can be run at all."""
    np_ = assignment.get("np")
    if np_ == "2" and assignment.get("nodes") == "uneven":
        return False  # two ranks make no uneven nodes
    if np_ in ("2", "3") and assignment.get("nodes") == "pairs":
        return False  # nodes of 2 over several nodes, all alike: np 4 only
    if np_ == "3" and assignment.get("local_sgd") == "replicas2":
        return False  # three ranks make no two-rank replicas
    return True


# Known failing today: (condition on the combination, failure tokens, reason). A token
# "phase:code" is where a run stopped and the error code it raised there, expected of the
# reference run and the variant alike (a failure of the program's semantics); "variant@phase:code"
# of the variant alone. The test prints the signature it saw for every failing combination.
KNOWN_FAILING = []


# Refused on every rank by name, by design: (condition, a fragment of the error, why, where).
# A fragment holds no '_': combinations.txt writes its spaces as '_'.
# where "construction": by a constructor (the optimizer's or the averager's), every rank the same
# error. where "call": by the call that cannot be combined (join() is a call, not a setting),
# on every rank of the reference run and the variant alike, each with the same error code and a
# message holding the fragment, none by timeout. The test requires exactly these to be refused
# (and every other combination to run bitwise), and the selection covers their other pairs
# again in combinations that run.
REFUSED = [
    # Refused by the optimizer's constructor, in the order it checks (the first that applies is raised).
    ({"overlap": "per_bucket", "algorithm": "muon_mixed"},
     "runs Muon, which updates each matrix whole once all of its gradient is reduced",
     "per_bucket updates each bucket as soon as its reduction lands, but a Muon matrix (often spanning buckets) "
     "needs its whole gradient before its Newton-Schulz: the optimizer refuses a Muon group with per_bucket "
     "overlap at construction (after_backward overlaps and runs Muon)", "construction"),
    ({"state": ["q8", "compact"], "algorithm": "sgd"},
     "is implemented for adam and adamw",
     "8-bit blockwise state exists for Adam's two moments; SGD's momentum keeps fp32 state, so a q8 SGD group is "
     "refused at construction", "construction"),
    ({"state": ["q8", "compact"], "partition": "flat"},
     "(8-bit blockwise moments) needs partition",
     "flat cuts parameters at equal shard boundaries, which may fall inside a 256-element q8 block, so N ranks "
     "would quantise differently from one (docs/compact_state.md); q8 groups need sorted_greedy", "construction"),
    ({"state": ["q8", "compact"], "overlap": "per_bucket"},
     "buckets would cut blocks",
     "per_bucket updates bucket by bucket, and buckets would cut q8 blocks", "construction"),
    ({"state": "compact", "dtype": "f32"},
     "master = remainder16 needs bf16 parameters",
     "a 16-bit remainder rebuilds the fp32 master of a bf16 parameter; an f32 parameter is its own master",
     "construction"),
    ({"state": "compact", "local_sgd": ["replicas1", "replicas2", "outer"]},
     "model averaging averages fp32 masters, so build the optimizer with master = fp32",
     "the replicas' averaging averages fp32 masters, which a remainder16 group does not keep: the "
     "PostLocalSGDOptimizer (its ModelAverager) refuses it at construction", "construction"),
    ({"np": "4", "overlap": ["after_backward", "per_bucket"], "local_sgd": "replicas2"},
     "averages gradients across 2 replicas on the caller's thread",
     "post-local SGD's warmup all-reduces gradients across replicas on the caller's thread while the overlap's "
     "communication thread reduces the same buffers (two threads in MPI under MPI_THREAD_SERIALIZED): "
     "PostLocalSGDOptimizer refuses an overlapped optimizer unless warmup_steps is 0", "construction"),
    # Refused by a call, in the order the program makes the calls.
    ({"local_sgd": ["replicas1", "replicas2", "outer"], "join": "on"},
     "Join does not combine with model averaging (rank",
     "Join under post-local SGD: join() is refused where it is called (Error(unsupported) naming the rank that "
     "called it), and the refusal travels into the next agreement of the replica and of each averaging group, so "
     "every rank of the world raises it by name at its next call that meets that rank, none by timeout "
     "(the replicas' averaging has no way to shadow a rank out of inputs)", "call"),
]


def first_refusal(row):
    """The index in REFUSED of the refusal a run of `row` raises (the first that applies), or None."""
    return next((i for i, (condition, *_) in enumerate(REFUSED) if matches(condition, row)), None)


def refusal(row):
    index = first_refusal(row)
    return None if index is None else REFUSED[index][1:]


def is_reference(row):
    return all(row[d] == v[0] for d, v in IMPLEMENTATION)


def signature(row, tokens):
    """The signature the test prints: sorted run@phase:code tokens joined by ';'."""
    runs = ["variant"] if is_reference(row) else ["reference", "variant"]
    out = set()
    for t in tokens:
        out.update([t] if "@" in t else [f"{run}@{t}" for run in runs])
    return ";".join(sorted(out))


def matches(condition, assignment):
    """Whether every dimension of `condition` is assigned one of its values."""
    return all(k in assignment and assignment[k] in (v if isinstance(v, (list, tuple)) else [v])
               for k, v in condition.items())


def all_pairs():
    """A deterministic greedy all-pairs selection: every valid pair of values of two dimensions
    appears in at least one combination that is not known failing, unless the pair is itself a
    known-failing condition (then in one that is): a failing run checks nothing else, so its
    other pairs are covered again by runs that do."""
    names = [d for d, _ in DIMENSIONS]
    values = dict(DIMENSIONS)
    rules = [condition for condition, *_ in KNOWN_FAILING + REFUSED]

    def assignment(row):
        return {names[k]: x for k, x in row.items()}

    def failing(row):
        return any(matches(r, assignment(row)) for r in rules)

    uncovered = set()
    for a, b in itertools.combinations(range(len(names)), 2):
        for va in values[names[a]]:
            for vb in values[names[b]]:
                if valid({names[a]: va, names[b]: vb}):
                    uncovered.add(((a, va), (b, vb)))
    rows = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (p[0][0], values[names[p[0][0]]].index(p[0][1]),
                                                         p[1][0], values[names[p[1][0]]].index(p[1][1])))
        row = {a: va, b: vb}
        allow_failing = failing(row)
        for d in range(len(names)):
            if d in row:
                continue
            best, best_gain = None, -1
            for v in values[names[d]]:
                trial = dict(row)
                trial[d] = v
                if not valid(assignment(trial)) or (failing(trial) and not allow_failing):
                    continue
                gain = sum(1 for k, x in row.items()
                           if ((min(k, d), x if k < d else v), (max(k, d), v if k < d else x)) in uncovered)
                if gain > best_gain:
                    best, best_gain = v, gain
            row[d] = best
        row_fails = failing(row)
        for a2, b2 in itertools.combinations(range(len(names)), 2):
            pair = ((a2, row[a2]), (b2, row[b2]))
            if not row_fails or failing(dict(pair)):
                uncovered.discard(pair)
        rows.append({names[d]: row[d] for d in range(len(names))})
    # One run per designed refusal that no row raises yet (a row matching several raises the
    # first), so the test sees each refused as it should be: the condition's first values, the
    # others at the reference's unless that lets an earlier refusal apply.
    for index, (condition, *_) in enumerate(REFUSED):
        if any(first_refusal(r) == index for r in rows):
            continue
        row = {n: (condition[n] if isinstance(condition.get(n), str) else
                   condition[n][0] if n in condition else values[n][0]) for n in names}
        for n in names:
            if first_refusal(row) == index:
                break
            if n in condition:
                continue
            # The row always matches the condition, so its first refusal is this one or an
            # earlier one: take the value that puts the earliest refusal latest.
            trials = [dict(row, **{n: v}) for v in values[n]]
            row = max((t for t in trials if valid(t)), key=first_refusal)
        assert first_refusal(row) == index, f"no combination raises refusal {index} first"
        rows.append(row)
    rows.sort(key=lambda r: [int(r["np"])] + [values[n].index(r[n]) for n in names[1:]])
    return rows


def known_failing(row):
    for condition, tokens, reason in KNOWN_FAILING:
        if matches(condition, row):
            return signature(row, tokens), reason
    return None


def combinations_text():
    for _, fragment, *_ in REFUSED:
        assert "_" not in fragment, f"refusal fragment {fragment!r} holds '_', which the test reads as a space"
    rows = all_pairs()
    names = [d for d, _ in DIMENSIONS]
    lines = ["# tests/matrix/combinations.txt — written by tools/feature_matrix.py (do not edit): "
             f"{len(rows)} combinations covering every valid pair of the dimensions' values.",
             "# expect=ok: bitwise the reference run; expect=refused:<fragment>: refused by a constructor on every",
             "# rank with an error containing the fragment (spaces as '_'); expect=refused_at_call:<fragment>: every",
             "# rank of both runs raised the same error code (not a timeout), each message containing the fragment;",
             "# expect=known_failing:<signature>: fails that way today (the reason follows the '#')."]
    for i, row in enumerate(rows):
        fields = " ".join(f"{n}={row[n]}" for n in names)
        mark = known_failing(row)
        refused = refusal(row)
        if mark is not None:
            expect, why = "known_failing:" + mark[0], mark[1]
        elif refused is not None:
            kind = "refused:" if refused[2] == "construction" else "refused_at_call:"
            expect, why = kind + refused[0].replace(" ", "_"), refused[1]
        else:
            expect, why = "ok", None
        line = f"c{i + 1:02d} {fields} expect={expect}"
        if why is not None:
            line += " # " + why
        lines.append(line)
    return "\n".join(lines) + "\n"


def parse_fields(line):
    body = line.split(" # ", 1)[0].split()
    return body[0], dict(f.split("=", 1) for f in body[1:])


def read_outcomes(paths):
    """Outcome lines the test writes: `<id> outcome=<kind> [signature=<sig>] message=<rest>`."""
    outcomes = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                if not line or line.startswith("#"):
                    continue
                head, _, message = line.partition(" message=")
                fields = head.split()
                entry = dict(f.split("=", 1) for f in fields[1:])
                entry["message"] = message
                outcomes[fields[0]] = entry
    return outcomes


def table_text(outcome_paths):
    with open(COMBINATIONS) as f:
        combos = [parse_fields(l) for l in f if l.strip() and not l.startswith("#")]
    outcomes = read_outcomes(outcome_paths)
    missing = [cid for cid, _ in combos if cid not in outcomes]
    if missing:
        sys.exit(f"no outcome for {', '.join(missing)}: run every feature_matrix_np* test first")
    names = [d for d, _ in IMPLEMENTATION + SEMANTICS]
    defaults = {d: v[0] for d, v in IMPLEMENTATION + SEMANTICS}
    counts = {}
    for cid, fields in combos:
        kind = outcomes[cid]["outcome"]
        counts.setdefault(fields["np"], {}).setdefault(kind, 0)
        counts[fields["np"]][kind] += 1
    kinds = ["pass", "refused", "known_failing", "FAIL"]
    out = ["# The feature matrix", "",
           "Written by `tools/feature_matrix.py table` from the outcomes of the `feature_matrix_np*` tests",
           "(tests/matrix/); do not edit. The test runs an all-pairs selection of the combinations of",
           "these dimensions: every value of one dimension meets every value of every other in some",
           "combination, at np 2, 3 or 4 (also a dimension of the pairs).", ""]
    for d, vals in DIMENSIONS:
        out.append(f"- `{d}`: {', '.join(vals)}")
    out += ["", "Each combination must either give parameters bitwise equal to the plain reference run of",
            "the same program (overlap off, stage 1, flat, node sharing off; the same dtype, local SGD,",
            "Join, mid-run operation, LR change, algorithm and state; the same world size; with 8-bit",
            "state the reference partitions sorted_greedy, as q8 needs) on every rank, or be refused by",
            "name on every rank: by a constructor (the optimizer's or the averager's), every rank the same",
            "error, or, for a combination that a call makes (join()), by that call and the calls that meet",
            "it, every rank of both runs the same error code (never a timeout) naming the refusal.",
            "A known-failing combination does neither today; the test asserts it still fails the same way.",
            "", "## Summary", "", "| np | combinations | " + " | ".join(kinds) + " |",
            "|---|---|" + "---|" * len(kinds)]
    for np_ in sorted(counts):
        c = counts[np_]
        out.append(f"| {np_} | {sum(c.values())} | " + " | ".join(str(c.get(k, 0)) for k in kinds) + " |")
    total = {k: sum(c.get(k, 0) for c in counts.values()) for k in kinds}
    out.append(f"| all | {len(combos)} | " + " | ".join(str(total[k]) for k in kinds) + " |")
    # A pair of values is implicated in a refusal or failure when no passing combination holds it.
    passing_pairs = set()
    for cid, fields in combos:
        if outcomes[cid]["outcome"] == "pass":
            passing_pairs.update(itertools.combinations([(n, fields[n]) for n in names], 2))

    def implicated(fields):
        pairs = [p for p in itertools.combinations([(n, fields[n]) for n in names], 2)
                 if p not in passing_pairs and (p[0][1] != defaults[p[0][0]] or p[1][1] != defaults[p[1][0]])]
        return ", ".join(f"{a}={va} + {b}={vb}" for (a, va), (b, vb) in pairs) or "—"

    def setting(fields):
        return " ".join(f"{n}={fields[n]}" for n in names if fields[n] != defaults[n]) or "(the reference)"

    for title, kind, note in [
            ("Refused", "refused",
             "Each refused combination, the error every rank raised (refused at a call: every rank's phase and code, and the first message), and the pairs of its values that no passing combination holds (the cause is among them; a refused run also leaves its other pairs unchecked)."),
            ("Known failing", "known_failing",
             "Neither bitwise nor refused by name on every rank today: what happened, and the pairs no passing combination holds.")]:
        rows = [(cid, f) for cid, f in combos if outcomes[cid]["outcome"] == kind]
        out += ["", f"## {title}", "", note, ""]
        if not rows:
            out.append("None.")
            continue
        out += ["| id | np | setting (values other than the reference's) | pairs never seen passing | error |",
                "|---|---|---|---|---|"]
        for cid, f in rows:
            message = outcomes[cid]["message"].replace("|", "\\|")
            out.append(f"| {cid} | {f['np']} | {setting(f)} | {implicated(f)} | {message} |")
    out += ["", "## Every combination", "", "| id | np | setting | outcome |", "|---|---|---|---|"]
    for cid, f in combos:
        out.append(f"| {cid} | {f['np']} | {setting(f)} | {outcomes[cid]['outcome']} |")
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) < 2 or argv[1] not in ("write", "check", "table"):
        sys.exit(__doc__)
    if argv[1] == "write":
        with open(COMBINATIONS, "w") as f:
            f.write(combinations_text())
        print(f"{COMBINATIONS}: {len(all_pairs())} combinations")
    elif argv[1] == "check":
        with open(COMBINATIONS) as f:
            if f.read() != combinations_text():
                sys.exit(f"{COMBINATIONS} is stale: run `python3 tools/feature_matrix.py write`")
        print("combinations.txt is what the generator writes")
    else:
        text = table_text(argv[2:])
        with open(TABLE, "w") as f:
            f.write(text)
        print(f"{TABLE} written")


if __name__ == "__main__":
    main(sys.argv)
