#!/usr/bin/env python
"""Merge the rows of one every-task run into another (`scripts/bench_tasks.py` results of the same model, tasks and
texts): `python scripts/merge_task_runs.py BASE NEW OUT`.

The rows of NEW replace BASE's rows of the same name; the full cache's row must agree between the two runs (the
same prompts and texts through the same model), or nothing is written."""
import json, math, sys

def merge(base:dict, new:dict)->dict:
    "BASE with NEW's rows; refuses runs whose full-cache rows differ."
    for kind, rows in new["continuation"].items():
        a, b = base["continuation"][kind]["full"]["nll"], rows["full"]["nll"]
        if not math.isclose(a, b, rel_tol=1e-4): raise ValueError(f"{kind}: the full cache's nll differs ({a} vs {b})")
    for task, fams in new["keys"].items():
        for fam, rows in fams.items():
            if base["keys"][task][fam]["full"] != rows["full"]:
                raise ValueError(f"{task}/{fam}: the full cache's answers differ")
    out = json.loads(json.dumps(base))
    for kind, rows in new["continuation"].items(): out["continuation"][kind].update(rows)
    for task, fams in new["keys"].items():
        for fam, rows in fams.items(): out["keys"][task][fam].update(rows)
    s = out["settings"]
    s["rows"] = {**s["rows"], **new["settings"]["rows"]}
    was = s.get("merged", [])                           # every merge is kept: the rows each one brought, its run time
    s["merged"] = (was if isinstance(was, list) else [was]) + [dict(rows=sorted(new["settings"]["rows"]),
                                                                    seconds=new["settings"]["seconds"])]
    return out

if __name__ == "__main__":
    base, new, out = sys.argv[1:4]
    json.dump(merge(json.load(open(base)), json.load(open(new))), open(out, "w"), indent=1)
    print("wrote", out)
