"""The WebShop and Search-QA `EnvFamily`s: splits and their task names, pool kwargs from the run
config, the warm-start experts (their episodes replay to a win on a fresh env), the "score" /
"acc" / "em" metrics (hand-worked), the adapters, the family's skill retriever and metrics as the
trainer uses them, and the `max_steps` name the trainer's pools pass to Search-QA."""

from __future__ import annotations

import pytest

import envs
from configs import search_qa as search_qa_config
from configs import webshop as webshop_config
from envs.search_qa import family as search_family
from envs.skills import SkillRetriever
from envs.skills.data_source_rules import DataSourceSkillRetriever
from envs.webshop import family as shop_family


def _env_section(module, **values):
  section = module.get_config("local=True").env
  section.unlock()
  for key, value in values.items():
    section[key] = value
  return section


def _view(observation: str, info: dict) -> envs.EpisodeView:
  return envs.EpisodeView(
    task=info["task"],
    task_type=info["task_type"],
    gamefile="",
    observation=observation,
    admissible=list(info["admissible_commands"]),
    history=[],
  )


# ------------------------------------------------------------------------------------ WebShop
def test_webshop_family_is_registered_with_its_pieces():
  family = envs.env_family("webshop")
  assert family.skills == "webshop" and family.skill_retriever is None
  assert family.split is shop_family.split and family.expert_records is shop_family.expert_records
  assert family.episode_metrics is shop_family.episode_metrics


def test_webshop_splits_name_the_originals_goal_indices():
  section = _env_section(webshop_config)
  test, train = shop_family.split(section, "test"), shop_family.split(section, "train")
  assert test.task_names == [f"goal_{i}" for i in range(500)]  # goals 0-499, fixed
  assert train.task_names[0] == "goal_500" and len(train.task_names) >= 500
  env = envs.make("webshop", **train.env_kwargs, seed=3, max_steps=15)
  for task in (0, len(train.task_names) - 1):
    _, info = env.reset(task=task)
    assert f"goal_{info['goal_index']}" == train.task_names[task]


def test_webshop_env_kwargs_follow_the_config():
  section = _env_section(webshop_config, data_seed=7, num_products=1200, human_goals=True)
  section.offline.seed = 5
  kwargs = shop_family.env_kwargs(section, "test")
  assert kwargs["data_seed"] == 7 and kwargs["num_generated_products"] == 1200
  assert kwargs["catalogue_seed"] == 5 and kwargs["human_goals"] and kwargs["data_dir"] is None


def test_webshop_expert_episodes_replay_to_a_score_one_purchase():
  section = _env_section(webshop_config, expert_episodes=3, max_turns=2)
  records = shop_family.expert_records(section, "train")
  assert len(records) == 3  # the oracle wins every goal, whatever env.max_turns
  env = envs.make("webshop", **shop_family.env_kwargs(section, "train"))
  for task, record in enumerate(records):
    observation, info = env.reset(task=task)
    assert record["task"] == info["task"] and record["steps"][0]["observation"] == observation
    assert record["steps"][0]["action"].startswith("search[")
    for step in record["steps"]:
      assert step["observation"] == observation
      observation, reward, done, info = env.step(step["action"])
    assert (reward, done, info["task_score"]) == (10.0, True, 1.0)


def test_webshop_metrics_are_mean_score_and_accuracy():
  infos = [
    {"task_score": 1.0, "won": True},
    {"task_score": 0.5, "won": False},
    {"task_score": 0.0, "won": False},  # nothing bought
    {"task_score": 0.25, "won": False},
  ]
  assert shop_family.episode_metrics(infos) == {"score": 0.4375, "acc": 0.25}
  assert shop_family.episode_metrics([]) == {}


def test_webshop_adapter_prompt_projection_and_skill_query():
  adapter = envs.env_family("webshop").adapter()
  env = envs.make("webshop", split="test")
  observation, info = env.reset(task=0)
  text = adapter.user_text(_view(observation, info), history_length=2)
  assert f"The customer's request: {info['task'].strip()}.\n" in text
  assert "The page you see now: 'Search'.\n" in text
  assert "'search[<your query>]',\n'click[search]',\n" in text
  assert adapter.project("<think>x</think><action>click[Buy Now]</action>") == (
    "click[buy now]",
    True,
  )
  # The keyword rule reads the whole prompt: a USB cable instruction selects electronics.md.
  view = _view(
    observation, dict(info, task="i need a usb cable, and price lower than 30.00 dollars")
  )
  retriever = SkillRetriever("webshop", strategy="rules", rules_version="post_fix")
  block = retriever.privileged_block(query=adapter.skill_query(view))
  assert "### TASK: electronics ###" in block


# ------------------------------------------------------------------------------------ Search-QA
def test_search_qa_family_uses_the_data_source_rule():
  family = envs.env_family("search_qa")
  assert family.skills == "search" and family.skill_retriever is DataSourceSkillRetriever


def test_search_qa_splits_take_their_data_sources():
  section = _env_section(search_qa_config)
  train, test = search_family.split(section, "train"), search_family.split(section, "test")
  train_env = envs.make("search_qa", **train.env_kwargs)
  test_env = envs.make("search_qa", **test.env_kwargs)
  assert {r.data_source for r in train_env.records} == {"nq", "hotpotqa"}
  assert {r.data_source for r in test_env.records} == {
    "nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle",
  }  # fmt: skip
  assert train.task_names == [r.id for r in train_env.records]
  assert len(set(test.task_names)) == len(test.task_names) == test_env.num_tasks


@pytest.mark.parametrize(
  "values, message",
  [
    ({"retriever": "e5"}, "env.retriever='e5': unknown retriever"),
    ({"retriever": "server"}, "env.retriever='server' needs env.search_url"),
    ({"search_url": "http://127.0.0.1:8000/retrieve"}, "Fix: set --config.env.retriever=server"),
  ],
)
def test_search_qa_retriever_settings_are_checked(values, message):
  with pytest.raises(ValueError, match="Fix:") as e:
    search_family.env_kwargs(_env_section(search_qa_config, **values), "train")
  assert message in str(e.value)


def test_search_qa_env_kwargs_pass_the_server_or_the_corpus():
  url = "http://127.0.0.1:8000/retrieve"
  server = search_family.env_kwargs(
    _env_section(search_qa_config, retriever="server", search_url=url), "test"
  )
  assert server["search_url"] == url and server["server_protocol"] == "search_r1"
  assert server["data_sources"].split(",")[-1] == "bamboogle" and "corpus_path" not in server
  corpus = search_family.env_kwargs(_env_section(search_qa_config, corpus="/c.jsonl"), "train")
  assert corpus["corpus_path"] == "/c.jsonl" and corpus["data_sources"] == "nq,hotpotqa"


def test_search_qa_expert_episodes_replay_to_an_exact_match():
  section = _env_section(search_qa_config, expert_episodes=6, max_turns=1)
  records = search_family.expert_records(section, "train")
  assert records and len(records) <= 6
  env = envs.make("search_qa", **search_family.env_kwargs(section, "train"))
  by_question = {r.question: k for k, r in enumerate(env.records)}
  for record in records:
    observation, info = env.reset(task=by_question[record["task"]])
    for step in record["steps"]:
      assert step["observation"] == observation
      observation, reward, done, info = env.step(step["action"])
    assert record["steps"][-1]["action"].startswith("<answer>")
    assert (reward, done, info["won"]) == (1.0, True, True)


def test_search_qa_metric_is_exact_match_rate():
  infos = [{"won": True}, {"won": False}, {"won": True}, {"won": True}]
  assert search_family.episode_metrics(infos) == {"em": 0.75}


def test_search_qa_accepts_the_trainers_max_steps():
  env = envs.make("search_qa", split="test", max_steps=2)
  env.reset(task=0)
  assert env.step("<search>anything</search>")[2] is False
  assert env.step("no tags at all")[2] is True  # the second turn is the last


def test_search_qa_adapter_shows_the_history_records():
  adapter = envs.env_family("search_qa").adapter()
  env = envs.make("search_qa", split="test")
  question, info = env.reset(task=0)
  view = _view(question, info)
  assert adapter.user_text(view, 4).startswith(
    "You answer questions by reasoning step by step, looking facts up with a search engine when "
    f"you need them.\nQuestion: {question}\n\nRespond for this step."
  )
  action, valid = adapter.project("<think>a</think><search>who</search><answer>x</answer>")
  assert (action, valid) == ("<search>who</search>", False)  # both tags: invalid
  observation = env.step(action)[0]
  view.history.append((question, action))
  view.observation = observation
  assert f"History:\nStep 1:<search>who</search> {observation}\n" in adapter.user_text(view, 4)


# ------------------------------------------------------------------------------------ trainer
def test_trainer_builds_the_familys_skill_retriever():
  from sdar_jax.run.setup import build_retriever

  search = build_retriever(search_qa_config.get_config("local=True"))  # rules_version pre_fix
  assert isinstance(search, DataSourceSkillRetriever)
  # The data_source rule holds whatever rules_version says (SkillRetriever's pre_fix would give
  # the general skills only).
  assert "### TASK: entity_attribute_lookup ###" in search.privileged_block(task_type="popqa")
  shop = build_retriever(webshop_config.get_config("local=True"))
  assert type(shop) is SkillRetriever


def test_rollout_metrics_add_the_familys_metrics():
  from sdar_jax.observe.metrics import rollout_metrics
  from sdar_jax.rollout.trajectory import Episode

  episodes = [
    Episode(0, 0, 0, won=True, info={"task_score": 1.0, "won": True}),
    Episode(1, 0, 0, info={"task_score": 0.5, "won": False}),
    Episode(2, 0, 0, env_error="RuntimeError: boom", info={"task_score": 0.0}),  # not counted
  ]
  metrics = rollout_metrics(episodes, "val", shop_family.episode_metrics)
  assert (metrics["val/score"], metrics["val/acc"]) == (0.75, 0.5)
  assert "val/score" not in rollout_metrics(episodes, "val")
