"""User errors: one message naming the file or key, the bad value and the fix, exit status 2, a
traceback only with --verbosity=1 (sdar_jax.infra.errors, envs.errors). Each bad input the
fault probe found (a read-only or full workdir, a gs:// workdir without the gcs extra, a prompt
over rollout.max_prompt_len, broken model, game and data files) is raised here in-process by the
function that meets it; a few real `python -m sdar_jax.train` runs check the command's handler."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from envs.errors import EnvFileNotFoundError, EnvInputError, exit_on_env_error
from sdar_jax.infra import paths
from sdar_jax.infra.errors import MissingExtraError, UserError, exit_on_user_error
from tests.helpers import REPO


# ------------------------------------------------------------------------------ the handler
def test_handler_prints_one_message_and_exits_2_with_the_traceback_only_when_verbose(capsys):
  from sdar_jax.run.setup import ConfigError

  def bad():
    raise ConfigError("train.iterations=-1: must be >= 0. Fix: pass a count")

  with pytest.raises(SystemExit) as exit_info:
    exit_on_user_error(bad, verbosity=lambda: 0)()
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err == "Invalid config: train.iterations=-1: must be >= 0. Fix: pass a count\n"
  with pytest.raises(SystemExit):
    exit_on_user_error(bad, verbosity=lambda: 1)()
  err = capsys.readouterr().err
  assert err.startswith("Traceback") and err.endswith("Fix: pass a count\n")


def test_handler_covers_full_and_read_only_disks_not_other_os_errors(capsys):
  def full():
    raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/metrics.jsonl")

  with pytest.raises(SystemExit) as exit_info:
    exit_on_user_error(full, verbosity=lambda: 0)()
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "No space left on device (/runs/x/metrics.jsonl)" in err and "--workdir" in err

  def bug():
    raise FileNotFoundError(errno.ENOENT, "No such file", "/x")

  with pytest.raises(FileNotFoundError):  # a bug keeps its traceback
    exit_on_user_error(bug, verbosity=lambda: 0)()


def test_env_handler_for_the_environment_commands(capsys, monkeypatch):
  monkeypatch.setattr(sys, "argv", ["python -m envs.datasets"])

  @exit_on_env_error
  def main():
    raise EnvFileNotFoundError("data_dir='/nope': no such folder. Fix: point it at the files")

  with pytest.raises(SystemExit) as exit_info:
    main()
  assert exit_info.value.code == 2
  assert (
    capsys.readouterr().err
    == "error: data_dir='/nope': no such folder. Fix: point it at the files\n"
  )


def test_the_projects_user_errors_keep_their_old_bases():
  """Existing `except ValueError` (and FileNotFoundError, RuntimeError) code still catches them."""
  from envs.alfworld.engine import GameFileError
  from envs.search_qa.data import QuestionFileError
  from envs.webshop.data import WebShopDataError, WebShopFilesMissingError
  from sdar_jax.models.config import ModelConfigFileError
  from sdar_jax.observe.collect import ReportShrinkError
  from sdar_jax.observe.pairing import CompareError
  from sdar_jax.rollout.agent_loop import PromptTooLongError
  from sdar_jax.run.checkpoint import CheckpointWriteError
  from sdar_jax.run.evaluation import EvaluationError
  from sdar_jax.run.guards import EnvFailureError
  from sdar_jax.run.setup import ConfigError
  from sdar_jax.run.workdir_lock import WorkdirLockedError
  from sdar_jax.text.tokenizer import TokenizerFilesNotFoundError

  bases = {
    ConfigError: ValueError,
    PromptTooLongError: ValueError,
    EvaluationError: ValueError,
    CompareError: ValueError,
    ModelConfigFileError: ValueError,
    WorkdirLockedError: RuntimeError,
    EnvFailureError: RuntimeError,
    TokenizerFilesNotFoundError: FileNotFoundError,
    ReportShrinkError: FileExistsError,
    CheckpointWriteError: OSError,
    MissingExtraError: ImportError,
  }
  for kind, base in bases.items():
    assert issubclass(kind, UserError) and issubclass(kind, base), kind
  for kind in (GameFileError, WebShopDataError, QuestionFileError):
    assert issubclass(kind, EnvInputError) and issubclass(kind, ValueError), kind
  assert issubclass(WebShopFilesMissingError, FileNotFoundError)


# ------------------------------------------------------------------------------ output folders
def test_unwritable_workdir_is_refused_at_start(tmp_path, monkeypatch):
  a_file = tmp_path / "notes.txt"
  a_file.write_text("x")
  with pytest.raises(paths.UnwritableFolderError, match=r"workdir=.*notes.txt/run.*is a file"):
    paths.check_writable_folder(str(a_file / "run"))

  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")

  monkeypatch.setattr(paths.tempfile, "TemporaryFile", read_only)
  with pytest.raises(paths.UnwritableFolderError) as info:
    paths.check_writable_folder(str(tmp_path / "new" / "run"), "checkpoint.dir")
  message = str(info.value)
  assert f"checkpoint.dir='{tmp_path}/new/run' (it would be made in {tmp_path})" in message
  assert "Read-only file system" in message and "Fix: pass a folder on a writable disk" in message
  assert not (tmp_path / "new").exists()  # nothing made


def test_gs_workdir_without_the_gcs_extra_names_the_pinned_extra(monkeypatch):
  import fsspec

  def no_gcsfs(name):
    raise ImportError("Install gcsfs to access Google Storage")

  monkeypatch.setattr(fsspec, "get_filesystem_class", no_gcsfs)
  with pytest.raises(MissingExtraError) as info:
    paths.check_writable_folder("gs://bucket/runs/a")
  message = str(info.value)
  assert "workdir='gs://bucket/runs/a' needs gcsfs" in message
  assert 'pip install -e ".[gcs]"' in message
  with open(os.path.join(REPO, "pyproject.toml")) as f:
    assert "\ngcs = [" in f.read()  # the extra the message names exists


def test_full_disk_during_a_checkpoint_is_one_message(tmp_path, monkeypatch, tiny_config):
  """TensorStore reports a full disk as a ValueError inside orbax's threads; the save turns it
  into a CheckpointWriteError naming the folder and the fix (errno ENOSPC)."""
  from sdar_jax.run import checkpoint

  monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the save's hooks are put back
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  manager = checkpoint.CheckpointManager(tmp_path / "ckpt")
  tensorstore_error = ValueError(
    'RESOURCE_EXHAUSTED: Error writing "params.embed/0" in OCDBT database at local file '
    f'"{tmp_path}/ckpt/3.orbax-checkpoint-tmp/": Failed to write 2560000 bytes to file 27: No '
    "space left on device [os_error_code='28']"
  )

  def save(*args, **kwargs):
    raise tensorstore_error

  monkeypatch.setattr(manager._manager, "save", save)
  with pytest.raises(checkpoint.CheckpointWriteError) as info:
    manager.save(3, None, tiny_config)
  manager.close()
  assert info.value.errno == errno.ENOSPC
  message = str(info.value)
  assert f"checkpoint 3 could not be written to {tmp_path}/ckpt (No space left on device" in message
  assert "MiB free there" in message and "Fix: free space on that disk" in message
  noise = RuntimeError("Event loop is closed")
  assert sys.excepthook is not sys.__excepthook__  # the leftover writes' reports are dropped
  assert checkpoint.write_errno(noise) is None


# ------------------------------------------------------------------------------ prompts
class _OneEnvPool:
  """A pool whose env 0 resets to an ALFWorld-like first observation."""

  def __init__(self, observation: str):
    self.observation = observation
    self.resets = []

  def reset(self, tasks, indices, progress=None):
    from envs.base import StepResult

    self.resets.append((list(tasks), list(indices)))
    info = {"task": "look at the book under the desklamp.", "task_type": "look_at_obj_in_light"}
    return [StepResult(self.observation, 0.0, False, dict(info, admissible_commands=["look"]))]


def test_prompt_over_max_prompt_len_is_found_at_start():
  from envs.alfworld import AlfworldAdapter
  from sdar_jax.core.sampling import SamplingParams
  from sdar_jax.rollout import AgentLoop
  from sdar_jax.rollout.agent_loop import PromptTooLongError
  from sdar_jax.text.chat_templates import ChatTemplate
  from sdar_jax.text.tokenizer import Tokenizer

  pool = _OneEnvPool("You are in the middle of a room. " * 8)
  common = dict(
    pool=pool,
    adapter=AlfworldAdapter(),
    sampler=None,
    tokenizer=Tokenizer.bundled_qwen(),
    chat_template=ChatTemplate.builtin("qwen3"),
    sampling=SamplingParams(max_new_tokens=4),
    max_turns=3,
  )
  loop = AgentLoop(**common, max_prompt_len=64, truncation="error")
  with pytest.raises(PromptTooLongError) as info:
    loop.check_first_prompt(5, where="at start: train task 5, first turn")
  assert pool.resets == [([5], [0])]
  message = str(info.value)
  assert message.startswith("at start: train task 5, first turn: the prompt has ")
  assert "rollout.max_prompt_len=64" in message and "prompt_truncation=left" in message
  # Cut prompts are allowed with truncation='left'; the check counts nothing.
  loose = AgentLoop(**common, max_prompt_len=64, truncation="left")
  assert loose.check_first_prompt(5, where="at start") is None and loose.truncated_prompts == 0


# ------------------------------------------------------------------------------ model files
@pytest.mark.parametrize(
  "content,expected",
  [
    ('{"model_type": "qwen3", "hidden_size": 64,', r"is not valid JSON \(.*line 1, column 43"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"model_type": "qwen3", "rope_theta": 1e6, "num_attention_heads": 4, "hidden_size": 8}',
     "lacks the field 'vocab_size'"),
  ],
)  # fmt: skip
def test_malformed_model_config_json_is_named(tmp_path, content, expected):
  from sdar_jax.models import ModelConfig
  from sdar_jax.models.config import ModelConfigFileError

  (tmp_path / "config.json").write_text(content)
  with pytest.raises(ModelConfigFileError, match=expected) as info:
    ModelConfig.from_hf_config(str(tmp_path))
  assert f"model config '{tmp_path}/config.json'" in str(info.value)
  assert "Fix: copy the model's config.json again" in str(info.value)


# ------------------------------------------------------------------------------ data files
@pytest.fixture(scope="module")
def webshop_files(tmp_path_factory) -> str:
  from envs.webshop import generator

  folder = tmp_path_factory.mktemp("webshop")
  generator.write_files(str(folder), 12, 0)
  return str(folder)


def _copy(src: str, dst) -> str:
  import shutil

  shutil.copytree(src, dst)
  return str(dst)


def _load(folder: str, **settings):
  from envs.webshop import data

  data.load_catalogue.cache_clear()
  return data.load_catalogue(folder, **settings)


def test_webshop_malformed_files_are_named(webshop_files, tmp_path):
  from envs.webshop.data import WebShopDataError

  products = "items_shuffle_1000.json"
  with open(os.path.join(webshop_files, products)) as f:
    records = json.load(f)
  cases = {
    "truncated": (json.dumps(records)[:150], rf"{products}' is not valid JSON \(.*column"),
    "dict": (
      json.dumps({"a": 1}),
      f"{products}' holds a JSON dict; the loader expects a JSON list",
    ),
    "no_name": (
      json.dumps([records[0], {k: v for k, v in records[1].items() if k != "name"}]),
      r"product record #1 \(asin '\w+'\) in '.*no_name' lacks the field 'name'",
    ),
    "no_category": (
      json.dumps([{k: v for k, v in r.items() if k != "category"} for r in records]),
      r"in '.*no_category': a product record lacks the field 'category'",
    ),
  }
  for name, (text, expected) in cases.items():
    folder = _copy(webshop_files, tmp_path / name)
    with open(os.path.join(folder, products), "w") as f:
      f.write(text)
    with pytest.raises(WebShopDataError, match=expected) as info:
      _load(folder)
    assert "Fix: download the WebShop data files again" in str(info.value), name
  folder = _copy(webshop_files, tmp_path / "bad_attributes")
  with open(os.path.join(folder, "items_ins_v2_1000.json"), "w") as f:
    json.dump({records[0]["asin"]: "not a record"}, f)
  with pytest.raises(WebShopDataError, match=r"its record in the attributes file is a str"):
    _load(folder)


def test_webshop_missing_file_message_lists_only_the_missing_one(webshop_files, tmp_path):
  from envs.webshop.data import WebShopFilesMissingError

  folder = _copy(webshop_files, tmp_path / "one_missing")
  os.remove(os.path.join(folder, "items_ins_v2_1000.json"))
  with pytest.raises(WebShopFilesMissingError) as info:
    _load(folder)
  message = str(info.value)
  assert (
    f"'{folder}' lacks ['items_ins_v2_1000.json'] (it has ['items_shuffle_1000.json'])" in message
  )
  with pytest.raises(FileNotFoundError, match="no such folder"):
    _load(str(tmp_path / "nowhere"))


def test_search_qa_file_that_is_not_parquet_is_named(tmp_path):
  from envs.search_qa.data import QuestionFileError, read_parquet

  path = tmp_path / "train.parquet"
  path.write_text("question,answer\nwho,me\n")
  with pytest.raises(QuestionFileError) as info:
    read_parquet(str(path))
  message = str(info.value)
  assert f"'{path}' cannot be read as parquet" in message and "23 bytes" in message
  assert "python -m envs.search_qa.generator" in message


def test_dataset_from_a_data_dir_that_does_not_exist_is_refused(tmp_path):
  from envs.datasets import build

  for env in ("webshop", "search_qa", "alfworld"):
    with pytest.raises(EnvFileNotFoundError, match=r"data_dir='.*nowhere': no such folder"):
      build(env, str(tmp_path / "out"), str(tmp_path / "nowhere"))
  assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ the command
def _train(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", "sdar_jax.train", *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_train_command_user_error_is_one_message_exit_2(tmp_path):
  """A workdir under a file: refused at start (also under --dry_run), before anything is
  compiled: one message, status 2, no traceback; --verbosity=1 adds the traceback."""
  a_file = tmp_path / "notes.txt"
  a_file.write_text("x")
  quiet = _train(f"--workdir={a_file}/run", "--dry_run")
  assert quiet.returncode == 2, quiet.stderr[-3000:]
  assert "Traceback" not in quiet.stderr
  expected = f"Cannot write: workdir='{a_file}/run': {a_file} is a file, not a folder. Fix:"
  assert quiet.stderr.strip().splitlines()[-1].startswith(expected), quiet.stderr[-3000:]
  assert "dry run: config valid" not in quiet.stdout
  verbose = _train(f"--workdir={a_file}/run", "--dry_run", "--verbosity=1")
  assert verbose.returncode == 2
  assert "Traceback (most recent call last)" in verbose.stderr and expected in verbose.stderr


def test_train_command_invalid_config_exits_2():
  out = _train("--config.train.micro_batch_size=3", "--dry_run")
  assert out.returncode == 2, out.stderr[-3000:]
  assert "Invalid config: " in out.stderr and "train.micro_batch_size=3" in out.stderr
  assert "Traceback" not in out.stderr


def test_train_dry_run_finds_a_first_prompt_over_max_prompt_len():
  """rollout.prompt_truncation='error' (WebShop's config): --dry_run builds the env pools without a
  sampler and checks the first prompts, so the run is refused before anything is compiled."""
  out = _train(
    "--config=configs/webshop.py:local=True", "--config.rollout.max_prompt_len=64", "--dry_run"
  )
  assert out.returncode == 2, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("Prompt too long: at start: train task 0, first turn: the prompt has ")
  assert "more than rollout.max_prompt_len=64" in last and "Traceback" not in out.stderr


@pytest.mark.parametrize("entry", ["run", "run_evaluation"])
def test_the_library_entries_check_the_config_before_building_anything(tmp_path, entry):
  """trainer.run / run_evaluation, called from Python, refuse a config the commands would refuse
  (here 2 episodes a step and micro-batches of 2 on a mesh that splits the batch 8 ways) with
  the same one-message ConfigError, before anything is compiled or written."""
  from sdar_jax.run import trainer
  from sdar_jax.run.setup import ConfigError
  from tests.helpers import tiny_run_config

  config = tiny_run_config(1, **{"mesh.data": 8, "mesh.tensor": 1})
  with pytest.raises(ConfigError, match=r"train\.micro_batch_size=2: not divisible by the mesh"):
    getattr(trainer, entry)(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ config values
def _problems(**overrides) -> str:
  from sdar_jax.run import config_validation
  from sdar_jax.run.setup import ConfigError
  from tests.helpers import tiny_run_config

  with pytest.raises(ConfigError) as info:
    config_validation.validate(tiny_run_config(1, **overrides))
  return str(info.value)


def test_non_finite_values_and_a_group_of_one_are_refused():
  """β = inf passes a range check written as a comparison and makes every update non-finite;
  one episode per task makes every group-relative advantage 0: both are refused at start."""
  text = _problems(**{"algo.beta": float("inf"), "optim.lr": float("nan")})
  assert "algo.beta=inf: not a finite number. Fix: give a finite value" in text
  assert "optim.lr=nan: not a finite number" in text
  text = _problems(**{"env.group_size": 1, "env.tasks_per_iteration": 2})
  assert "env.group_size=1: algo.advantage='grpo' compares each episode" in text
  assert "Fix: env.group_size >= 2" in text and "algo.pg_coef=0" in text


def test_a_tokenizer_beyond_the_models_vocabulary_and_a_contradictory_config_json(tmp_path):
  """The tiny model has 1,664 embeddings; the bundled Qwen tokenizer has ids up to 151,668: the
  first sampled id past the table would fail mid-run, so validation names it. A config.json whose
  model_type contradicts its architectures is refused, not loaded as either."""
  from sdar_jax.models import ModelConfig
  from sdar_jax.text.tokenizer import bundled_qwen_tokenizer_dir

  qwen = str(bundled_qwen_tokenizer_dir())
  text = _problems(**{"model.tokenizer_dir": qwen})
  assert f"model.tokenizer_dir={qwen!r}: its tokenizer has ids up to 151668, beyond the " in text
  assert "model's 1664 embeddings" in text
  hf = ModelConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                   num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                   qk_norm=True).to_hf_config()  # fmt: skip
  (tmp_path / "config.json").write_text(json.dumps({**hf, "model_type": "llama"}))
  with pytest.raises(ValueError, match=r"model_type='llama' contradicts architectures=\['Qwen3"):
    ModelConfig.from_hf_config(str(tmp_path))
  (tmp_path / "config.json").write_text(json.dumps({**hf, "model_type": "qwen2"}))
  with pytest.raises(ValueError, match="Fix: correct the file"):
    ModelConfig.from_hf_config(str(tmp_path))


def test_a_missing_or_broken_config_file_is_one_message(tmp_path):
  from sdar_jax import train
  from sdar_jax.run.setup import ConfigError

  with pytest.raises(ConfigError, match=r"--config=.*nope\.py: no such file\. Fix: pass a config"):
    train._check_overrides(["train", f"--config={tmp_path}/nope.py"])
  (tmp_path / "bad.py").write_text("def get_config(:\n")
  with pytest.raises(ConfigError, match=r"bad\.py: line 1: invalid syntax .*Fix: correct the"):
    train._check_overrides(["train", f"--config={tmp_path}/bad.py", "--dry_run"])


def test_a_broken_skills_folder_is_named_with_its_file_and_position(tmp_path):
  """A skill_mapping.json that is not JSON: the file, line and column, and the fix; --dry_run
  reaches it through the config's checks."""
  import shutil

  from envs.skills.library import skills_dir
  from envs.skills.retrieval import skills_section_problems

  folder = tmp_path / "skills"
  shutil.copytree(skills_dir("alfworld_brief"), folder)
  (folder / "skill_mapping.json").write_text('{"skill_files": {"general": "a.md",\n  oops}\n')
  section = {"dir": str(folder), "strategy": "rules", "rules_version": "post_fix"}
  (problem,) = skills_section_problems(section)
  assert "skill_mapping.json: not valid JSON (line 2, column 3: Expecting" in problem
  assert problem.startswith(f"env.skills.dir={str(folder)!r}: ") and "Fix: correct" in problem
  assert skills_section_problems({**section, "strategy": "none"}) == []  # never read


def test_a_chat_template_the_sandbox_refuses_is_found_at_start(tmp_path):
  import shutil

  from sdar_jax.text.tokenizer import packaged_tokenizer_dir

  folder = tmp_path / "tok"
  shutil.copytree(packaged_tokenizer_dir("alfworld_compact"), folder)
  construct = "{{ messages[0].content.__class__.__mro__[1].__subclasses__() }}"
  (folder / "chat_template.jinja").write_text(construct)
  text = _problems(**{"model.tokenizer_dir": str(folder)})
  assert "model.chat_template='auto': The chat template of " in text
  assert "chat_template.jinja was refused by the sandbox: access to attribute '__class__'" in text
  assert "Fix: remove that construct from the template" in text


def test_an_unwritable_home_is_caught_at_start(tmp_path, monkeypatch):
  """ALFWorld creates ~/.cache/alfworld on import, in every env worker: a HOME that cannot hold
  it is named at start (HOME under a file: refused even for root)."""
  from envs.alfworld import start_check
  from envs.errors import EnvInputError

  (tmp_path / "a_file").write_text("x")
  home = str(tmp_path / "a_file" / "home")
  monkeypatch.setenv("HOME", home)
  monkeypatch.delenv("ALFWORLD_DATA", raising=False)
  monkeypatch.delenv("SDAR_DATA_CACHE", raising=False)
  with pytest.raises(EnvInputError) as info:
    start_check({"name": "alfworld", "data_dir": None})
  message = str(info.value)
  assert message.startswith(f"ALFWORLD_DATA='{home}/.cache/alfworld' (HOME={home!r}) cannot be")
  assert "Fix: point HOME at a writable folder, or set ALFWORLD_DATA" in message
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "alf"))  # a writable one: the next folder
  with pytest.raises(EnvInputError, match=r"^SDAR_DATA_CACHE="):
    start_check({"name": "alfworld", "data_dir": None})
  monkeypatch.setenv("SDAR_DATA_CACHE", str(tmp_path / "games"))
  start_check({"name": "alfworld", "data_dir": None})
