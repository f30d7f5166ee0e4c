r"""One config per cell group of the paper's results table: method x model x environment.

  python -m sdar_jax.train --config=configs/paper.py:row=sdar,model=qwen2.5-3b,env=alfworld \
      --config.model.path=/data/Qwen2.5-3B-Instruct --config.env.data_dir=/data/alfworld

Without model.path a row names a real model it has no weights for and is refused, unless random
weights are asked for explicitly. To try a row at small shapes on a CPU: ``local=True`` (the tiny
model, random weights, the generated data; the row's method, skill rules and validation modes
kept), or the real row with overrides, as tests/integration/test_paper_rows_small.py runs every WebShop and
Search-QA row:

  python -m sdar_jax.train --config=configs/paper.py:row=sdar,env=webshop,local=True \
      --config.train.iterations=1 --workdir=runs/paper-small
  python -m sdar_jax.train --config=configs/paper.py:row=sdar,env=search_qa \
      --config.model.preset=tiny --config.model.random_init=True --dry_run

`rows()` lists every argument string (10 methods x 3 models x 3 environments). Each config is the
environment's reference config (configs/alfworld.py, webshop.py, search_qa.py) with the row's
method, plus a `paper` section: which validation metric the row reads and the numbers the paper
reports for it (docs/reference.md §7, in %), so a finished run can be compared with the table
(`python -m sdar_jax.compare RUN_DIR`). Search-QA rows validate on the whole test split, as the
authors do (eval.num_tasks=-1, 512 questions at a time; local=True keeps the small draw); its "avg"
column is the macro mean over the seven data sets (val/macro_success_rate), ALFWorld's the overall
success rate.

Rows, as the reference ran them (docs/reference.md §2):
- vanilla / skill_prompt: no training (iterations 0), one validation without / with skills in
  the student prompt.
- opsd, grpo, grpo_opsd, skill_sd, rlsd, sdar: the presets of the same names.
- skill_grpo and skill_grpo_star: ONE training run (skills in the student prompt) validated both
  ways; "skill_grpo" reads the validation without skills, "skill_grpo_star" the one with skills.

The paper was run before the authors' skill-retrieval fix (docs/reference.md §3.2): ALFWorld and WebShop
teachers saw the general skills only (rules_version "pre_fix"); Search-QA selected by data source
either way ("post_fix" reproduces that).
"""

from __future__ import annotations

from configs import alfworld, common, search_qa, webshop

MODELS = ("qwen2.5-3b", "qwen2.5-7b", "qwen3-1.7b")
ENV_MODULES = {"alfworld": alfworld, "webshop": webshop, "search_qa": search_qa}
COLUMNS = {
  "alfworld": ("pick", "look", "clean", "heat", "cool", "pick2", "avg"),
  "search_qa": (
    "nq",
    "triviaqa",
    "popqa",
    "hotpotqa",
    "2wikimultihopqa",
    "musique",
    "bamboogle",
    "avg",
  ),
  "webshop": ("score", "acc"),
}
_SKILLS_RULES = {"alfworld": "pre_fix", "webshop": "pre_fix", "search_qa": "post_fix"}

# row -> (algo preset, trained?, eval.skills mode, which validation the row reads)
ROWS: dict[str, tuple[str, bool, str, str]] = {
  "vanilla": ("grpo", False, "without", "without"),
  "skill_prompt": ("skill_grpo", False, "with", "with"),
  "opsd": ("opsd", True, "without", "without"),
  "grpo": ("grpo", True, "without", "without"),
  "skill_grpo": ("skill_grpo", True, "both", "without"),
  "skill_grpo_star": ("skill_grpo", True, "both", "with"),
  "grpo_opsd": ("grpo_opsd", True, "without", "without"),
  "skill_sd": ("skill_sd", True, "without", "without"),
  "rlsd": ("rlsd", True, "without", "without"),
  "sdar": ("sdar", True, "without", "without"),
}

# model -> row -> (ALFWorld columns, Search-QA columns, WebShop columns), transcribed from the
# table in docs/reference.md §7.
_REPORTED = {
  "qwen2.5-3b": {
    "vanilla": (
      (44.4, 11.1, 6.2, 15.4, 28.6, 12.5, 21.9),
      (24.6, 48.1, 31.0, 26.3, 25.3, 7.2, 59.7, 31.7),
      (6.7, 0.8),
    ),
    "skill_prompt": (
      (51.7, 66.7, 48.4, 0.0, 4.3, 10.0, 28.9),
      (23.7, 46.2, 30.6, 24.4, 22.1, 7.5, 12.5, 23.9),
      (0.2, 0.8),
    ),
    "opsd": (
      (48.8, 41.7, 16.7, 0.0, 15.8, 16.7, 28.1),
      (0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0),
      (11.3, 3.1),
    ),
    "grpo": (
      (91.2, 62.5, 96.2, 61.9, 65.0, 47.4, 75.0),
      (39.3, 60.6, 41.1, 37.4, 34.6, 15.4, 26.4, 36.4),
      (79.8, 63.3),
    ),
    "skill_grpo": (
      (88.9, 71.4, 58.8, 70.6, 40.7, 29.2, 60.2),
      (43.5, 58.8, 43.0, 36.8, 32.2, 11.7, 12.5, 34.1),
      (77.3, 60.9),
    ),
    "skill_grpo_star": (
      (94.3, 57.1, 100.0, 66.7, 73.1, 57.1, 80.5),
      (44.3, 59.6, 44.3, 39.0, 36.1, 14.5, 14.9, 36.1),
      (76.3, 66.4),
    ),
    "grpo_opsd": (
      (100.0, 82.4, 85.7, 75.0, 70.0, 60.0, 81.2),
      (44.9, 61.2, 45.2, 40.4, 38.5, 16.0, 66.1, 44.6),
      (77.8, 66.4),
    ),
    "skill_sd": (
      (88.2, 50.0, 96.2, 52.4, 65.0, 57.9, 73.4),
      (44.4, 60.4, 44.0, 39.5, 40.4, 15.4, 64.9, 44.1),
      (75.9, 64.0),
    ),
    "rlsd": (
      (87.9, 75.0, 90.9, 75.0, 73.1, 68.4, 79.7),
      (41.5, 58.6, 42.3, 40.4, 40.2, 16.8, 66.9, 43.8),
      (84.4, 66.4),
    ),
    "sdar": (
      (97.1, 62.5, 100.0, 61.9, 75.0, 84.2, 84.4),
      (44.8, 58.1, 44.3, 38.6, 36.2, 15.7, 66.1, 43.4),
      (85.0, 68.0),
    ),
  },
  "qwen2.5-7b": {
    "vanilla": (
      (36.1, 22.2, 3.1, 0.0, 0.0, 0.0, 12.5),
      (25.2, 50.8, 29.5, 29.0, 29.0, 10.4, 63.7, 33.9),
      (5.9, 1.6),
    ),
    "skill_prompt": (
      (51.7, 50.0, 32.3, 5.3, 4.3, 0.0, 23.4),
      (30.9, 52.1, 32.7, 32.7, 27.9, 12.7, 66.1, 36.4),
      (1.7, 0.8),
    ),
    "opsd": (
      (50.0, 60.0, 22.7, 21.4, 17.6, 9.5, 32.8),
      (8.8, 8.6, 17.5, 2.5, 4.2, 0.5, 1.2, 6.2),
      (4.5, 2.3),
    ),
    "grpo": (
      (91.2, 87.5, 96.2, 81.0, 65.0, 57.9, 81.2),
      (45.1, 63.7, 44.0, 43.6, 43.2, 16.8, 37.6, 42.0),
      (80.9, 72.6),
    ),
    "skill_grpo": (
      (88.5, 66.7, 65.2, 61.1, 57.7, 73.1, 69.5),
      (45.2, 63.7, 45.7, 43.1, 43.3, 19.6, 21.4, 40.3),
      (80.4, 71.9),
    ),
    "skill_grpo_star": (
      (100.0, 83.3, 96.4, 83.3, 75.0, 78.9, 88.3),
      (44.8, 63.0, 45.1, 43.7, 43.7, 20.5, 71.4, 47.5),
      (87.0, 81.2),
    ),
    "grpo_opsd": (
      (91.4, 61.5, 100.0, 87.5, 76.5, 52.2, 80.4),
      (47.3, 64.5, 46.9, 43.8, 39.3, 18.0, 69.4, 47.0),
      (86.8, 76.5),
    ),
    "skill_sd": (
      (93.9, 93.8, 90.9, 100.0, 69.2, 68.4, 85.1),
      (47.1, 64.5, 47.8, 44.2, 42.1, 20.2, 69.0, 47.8),
      (86.1, 76.5),
    ),
    "rlsd": (
      (100.0, 87.5, 92.3, 58.8, 80.0, 65.2, 82.0),
      (46.8, 63.0, 44.4, 45.5, 48.9, 21.5, 73.0, 49.0),
      (87.4, 77.3),
    ),
    "sdar": (
      (94.7, 75.0, 100.0, 86.7, 68.2, 78.9, 85.9),
      (46.3, 63.5, 48.2, 43.8, 48.4, 19.6, 73.0, 49.0),
      (89.4, 82.8),
    ),
  },
  "qwen3-1.7b": {
    "vanilla": (
      (25.0, 22.2, 3.1, 0.0, 21.4, 4.2, 12.5),
      (29.4, 46.9, 37.0, 23.5, 19.6, 6.4, 10.5, 24.8),
      (46.5, 4.7),
    ),
    "skill_prompt": (
      (10.3, 50.0, 16.1, 0.0, 0.0, 5.0, 9.4),
      (29.4, 46.5, 36.2, 22.9, 20.8, 4.3, 10.1, 24.3),
      (23.0, 2.3),
    ),
    "opsd": (
      (26.3, 33.3, 9.1, 0.0, 4.5, 5.3, 14.1),
      (4.2, 8.3, 4.6, 6.6, 15.3, 0.7, 1.2, 5.8),
      (47.4, 9.3),
    ),
    "grpo": (
      (71.1, 41.7, 36.4, 40.0, 31.8, 31.6, 46.1),
      (40.0, 58.9, 43.5, 35.4, 30.3, 12.0, 65.7, 40.8),
      (67.3, 38.3),
    ),
    "skill_grpo": (
      (27.6, 54.5, 22.7, 27.3, 0.0, 19.2, 21.1),
      (39.2, 58.6, 43.9, 35.2, 28.2, 11.5, 66.1, 40.4),
      (73.4, 46.1),
    ),
    "skill_grpo_star": (
      (31.4, 42.9, 51.9, 8.3, 11.5, 7.1, 28.1),
      (38.0, 58.4, 43.9, 36.3, 29.0, 12.5, 66.9, 40.7),
      (80.4, 50.0),
    ),
    "grpo_opsd": (
      (38.2, 50.0, 30.8, 28.6, 30.0, 21.1, 32.0),
      (40.7, 58.9, 45.0, 37.0, 34.6, 13.3, 65.7, 42.2),
      (70.7, 38.3),
    ),
    "skill_sd": (
      (52.9, 37.5, 69.2, 42.9, 60.0, 36.8, 52.3),
      (39.1, 57.5, 45.4, 34.8, 34.1, 10.7, 64.1, 40.8),
      (81.8, 53.9),
    ),
    "rlsd": (
      (50.0, 37.5, 61.5, 19.0, 50.0, 21.1, 42.2),
      (38.6, 57.3, 43.0, 34.5, 34.1, 11.5, 65.3, 40.6),
      (74.0, 50.8),
    ),
    "sdar": (
      (73.5, 25.0, 76.9, 33.3, 40.0, 36.8, 53.9),
      (39.7, 58.9, 45.3, 35.9, 35.5, 12.6, 65.3, 41.9),
      (76.8, 58.6),
    ),
  },
}


def reported(row: str, model: str, env: str) -> dict[str, float]:
  """The paper's numbers (%) for one row, model and environment, by column name."""
  alf, search, shop = _REPORTED[model][row]
  values = {"alfworld": alf, "search_qa": search, "webshop": shop}[env]
  return dict(zip(COLUMNS[env], values))


def get_config(arg: str = "row=sdar,model=qwen2.5-3b,env=alfworld,local=False"):
  arg = common.parse_arg(arg, row="sdar", model="qwen2.5-3b", env="alfworld", local=False)
  for key, valid in (("row", ROWS), ("model", MODELS), ("env", ENV_MODULES)):
    if arg[key] not in valid:
      raise ValueError(f"paper config: unknown {key} {arg[key]!r}; valid: {sorted(valid)}")
  algo_name, trained, eval_skills, reads = ROWS[arg.row]
  config = ENV_MODULES[arg.env].get_config(f"model={arg.model},algo={algo_name},local={arg.local}")
  config.unlock()
  config.env.skills.rules_version = _SKILLS_RULES[arg.env]
  config.eval.skills = eval_skills
  if not trained:
    config.train.iterations = 0
    config.train.eval_before_train = True
  if arg.env == "search_qa" and not arg.local:  # the whole test split, 512 at a time
    config.eval.num_tasks = -1
    config.eval.batch_size = 512
  config.paper = dict(
    row=arg.row,
    model=arg.model,
    env=arg.env,
    reads=reads,
    reported=reported(arg.row, arg.model, arg.env),
  )
  config.lock()
  return config


def rows() -> list[str]:
  """Every argument string of the table, in table order per model and environment."""
  return [f"row={r},model={m},env={e}" for m in MODELS for e in ENV_MODULES for r in ROWS]
