"""Search-QA questions: the record type, Search-R1 / verl-agent parquet files, success rates per source.

Parquet layouts read (docs/reference.md §7):
- Search-R1 (`qa_search_{train,test}_merge.py`, the HF `nq_hotpotqa_train` files): columns `id`,
  `question`, `golden_answers` (list of str), `data_source`, `prompt`, `ability`,
  `reward_model` ({"style": "rule", "ground_truth": {"target": [...]}}), `extra_info`
  ({"split", "index"}), and the FlashRAG `metadata`.
- verl-agent's processed files (`searchR1_processed_direct/{train,test}.parquet`): `data_source`,
  `prompt`, `ability`, `reward_model`, `metadata`, `extra_info`, and `env_kwargs`
  ({"ground_truth": {"target": [...]}, "question", "data_source"}).
The question comes from `question`, else `env_kwargs.question`, else `extra_info.question`; the gold
answers from `golden_answers`, else `reward_model.ground_truth.target`, else
`env_kwargs.ground_truth.target`; the source from `data_source`, else `env_kwargs.data_source`.

`write_parquet` writes records in the Search-R1 layout (what the generator emits).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from envs import common
from envs.errors import EnvFileNotFoundError, EnvInputError

__all__ = [
  "DATA_SOURCES",
  "TRAIN_SOURCES",
  "QARecord",
  "QuestionFileError",
  "find_split_file",
  "read_parquet",
  "success_rates",
  "write_parquet",
]

# The seven data sets of the paper's Search-QA table, in its column order.
DATA_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
TRAIN_SOURCES = ("nq", "hotpotqa")  # Search-R1's training mix


@dataclasses.dataclass(frozen=True)
class QARecord:
  """One question: its text, the accepted answers and the data set it comes from."""

  question: str
  golden_answers: tuple[str, ...]
  data_source: str
  id: str = ""
  metadata: Mapping[str, Any] | None = None  # generator: {"kind", "hops": [...]}; real: FlashRAG's


def _get(row: Mapping[str, Any], *path: str) -> Any:
  node: Any = row
  for key in path:
    if not isinstance(node, Mapping) or node.get(key) is None:
      return None
    node = node[key]
  return node


def _answers(value: Any) -> tuple[str, ...] | None:
  if value is None:
    return None
  if isinstance(value, str):
    return (value,)
  return tuple(str(v) for v in value)


class QuestionFileError(EnvInputError):
  """A question file that is not a readable parquet, or lacks the questions' columns."""


def _record(row: Mapping[str, Any], index: int, path: str) -> QARecord:
  question = row.get("question") or _get(row, "env_kwargs", "question")
  question = question or _get(row, "extra_info", "question")
  if not isinstance(question, str) or not question.strip():
    raise QuestionFileError(
      f"{path} row {index} has no question (looked at question, env_kwargs.question, "
      "extra_info.question); is this a Search-R1 or verl-agent search parquet?"
    )
  answers = _answers(row.get("golden_answers"))
  for path_keys in (
    ("reward_model", "ground_truth", "target"),
    ("env_kwargs", "ground_truth", "target"),
  ):
    if answers is None:
      answers = _answers(_get(row, *path_keys))
  if answers is None:
    raise QuestionFileError(
      f"{path} row {index} has no gold answers (looked at golden_answers, "
      "reward_model.ground_truth.target, env_kwargs.ground_truth.target)"
    )
  source = row.get("data_source") or _get(row, "env_kwargs", "data_source") or "unknown"
  record_id = row.get("id")
  if record_id is None:
    record_id = _get(row, "extra_info", "index")
  metadata = row.get("metadata")
  return QARecord(
    question=question.strip(),
    golden_answers=answers,
    data_source=str(source),
    id=str(record_id) if record_id is not None else str(index),
    metadata=metadata if isinstance(metadata, Mapping) else None,
  )


_WANTED = (
  "id",
  "question",
  "golden_answers",
  "data_source",
  "reward_model",
  "env_kwargs",
  "extra_info",
  "metadata",
)


def read_parquet(path: str, data_sources: Sequence[str] | None = None) -> list[QARecord]:
  """Questions of a Search-R1 or verl-agent parquet file, optionally only those of `data_sources`."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  if not os.path.isfile(path):
    raise EnvFileNotFoundError(f"question file {path} does not exist")
  try:
    schema_names = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[c for c in _WANTED if c in schema_names])
  except (pa.ArrowException, OSError) as err:  # ArrowInvalid: not parquet, or cut short
    raise QuestionFileError(
      f"Search-QA question file {path!r} cannot be read as parquet ({str(err).rstrip('.')}; the file has "
      f"{os.path.getsize(path)} bytes). Fix: download Search-R1's train.parquet/test.parquet "
      "again, or write generated ones with: python -m envs.search_qa.generator --out DIR"
    ) from None
  records = [_record(row, i, path) for i, row in enumerate(table.to_pylist())]
  if data_sources is not None:
    wanted = set(data_sources)
    records = [r for r in records if r.data_source in wanted]
  return records


def write_parquet(records: Iterable[QARecord], path: str, split: str) -> None:
  """Writes records in the Search-R1 layout (prompt = Search-R1's prefix, reward_model, extra_info)."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  from envs.search_qa.prompts import search_r1_prefix

  rows = []
  for index, r in enumerate(records):
    rows.append(
      {
        "id": r.id or f"{split}_{index}",
        "question": r.question,
        "golden_answers": list(r.golden_answers),
        "data_source": r.data_source,
        "prompt": [{"role": "user", "content": search_r1_prefix(r.question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(r.golden_answers)}},
        "extra_info": {"split": split, "index": index},
        "metadata": dict(r.metadata) if r.metadata else None,
      }
    )
  if not rows:
    raise ValueError(f"no records to write to {path}")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  pq.write_table(pa.Table.from_pylist(rows), path)


def find_split_file(data_dir: str, split: str) -> str:
  """`data_dir/{split}.parquet` (also accepts a path to a parquet file as `split`)."""
  if split.endswith(".parquet") and os.path.isfile(split):
    return split
  path = os.path.join(os.path.expanduser(data_dir), f"{split}.parquet")
  if not os.path.isfile(path):
    present = sorted(f for f in os.listdir(os.path.expanduser(data_dir)) if f.endswith(".parquet"))
    raise EnvFileNotFoundError(
      f"no {split}.parquet in {data_dir} (parquet files there: {present}); point data_dir at a "
      "folder with Search-R1's train.parquet/test.parquet, or generate one with "
      "python -m envs.search_qa.generator --out DIR"
    )
  return path


def success_rates(episodes: Iterable[tuple[str, bool]]) -> dict[str, float]:
  """Success rates from (data_source, won) per episode: "success_rate" over all episodes and one
  "<data_source>_success_rate" per source that occurred (verl-agent's validation keys)."""
  return common.success_rates(episodes)
