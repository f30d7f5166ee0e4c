"""Prints docs/results.md's second-stage tables from a report folder's CSVs (scratch helper)."""
import csv, sys, os
d = sys.argv[1]
rd = lambda n: list(csv.DictReader(open(os.path.join(d, n))))
f = lambda x, k=3: f"{float(x):.{k}f}"
s = lambda x: f"{float(x):+.3f}"
def rate(r):
  return {"0.0005": "5e-4", "0.001": "1e-3", "0.00025": "2.5e-4"}.get(r, r)
out = []
out += ["| arm | rate | seeds | held-out seen | held-out unseen | valid_seen final | valid_seen AUC | min / run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
for r in rd("summary.csv"):
  out.append(f"| `{r['arm']}` | {rate(r['rate'])} | {r['seeds']} | {f(r['heldout_seen'])} ± {f(r['heldout_seen_sd'])} "
             f"| {f(r['heldout_unseen'])} ± {f(r['heldout_unseen_sd'])} | {f(r['valid_seen_final'])} "
             f"| {f(r['valid_seen_auc'])} ± {f(r['valid_seen_auc_sd'])} | {f(r['wall_min'],1)} |")
out += ["", "| comparison | measure | seeds | difference | interval | Holm p |", "|---|---|---:|---:|---:|---:|"]
for r in rd("paired.csv"):
  a, b = r["comparison"].split(" - ")
  sig = float(r["ci_low"]) > 0 or float(r["ci_high"]) < 0
  diff, iv = s(r["difference"]), f"[{s(r['ci_low'])}, {s(r['ci_high'])}]"
  if sig: diff, iv = f"**{diff}**", f"**{iv}**"
  m = r["measure"].replace("heldout_", "held-out ")
  out.append(f"| `{a}` - `{b}` | {m} | {r['seeds']} | {diff} | {iv} | {float(r['holm_p']):.2g} |")
out += ["", "| arm | panel | seeds | without | with | with - without | interval | Holm p |", "|---|---|---:|---:|---:|---:|---:|---:|"]
for r in rd("internalisation.csv"):
  sig = float(r["ci_low"]) > 0 or float(r["ci_high"]) < 0
  diff, iv = s(r["difference"]), f"[{s(r['ci_low'])}, {s(r['ci_high'])}]"
  if sig: diff, iv = f"**{diff}**", f"**{iv}**"
  m = r["measure"].removeprefix("final ").replace("heldout_", "held-out ")
  out.append(f"| `{r['arm']}` | {m} | {r['seeds']} | {f(r['without'])} | {f(r['with'])} | {diff} | {iv} | {float(r['holm_p']):.2g} |")
out += ["", "| seed | retired | teacher success | competence at 16 | progress at 16 |", "|---:|---|---:|---:|---:|"]
for r in rd("retirement.csv"):
  at = "no" if not r["retired_at"] else f"after iteration {r['retired_at']}"
  out.append(f"| {r['seed']} | {at} | {f(r['teacher_success'])} | {f(r['competence'])} | {s(r['progress'])} |")
print("\n".join(out))
