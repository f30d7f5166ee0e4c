"""Teacher context sources (sdar_jax.algos.contexts) on hand-made episodes, with a character
tokenizer (one token per character) so budgets and token counts are checked by hand: the exact
teacher prompt text of "skills", "sibling" and "hindsight", a group without a success, one-turn
episodes, a budget that cuts, composed sources, templates from a file, and the settings' errors.
"""

from __future__ import annotations

import dataclasses

import pytest

from sdar_jax import algos
from sdar_jax.algos import compose_teacher_contexts, context_metrics, get_preset
from sdar_jax.rollout.trajectory import Episode, Turn


def encode(text: str) -> list[int]:
  return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
  return "".join(chr(i) for i in ids)


def _turn(observation: str, action: str, prompt: str = "P", block: str | None = None) -> Turn:
  return Turn(
    prompt_ids=encode(prompt),
    response_ids=[1, 2],
    logprobs=[-0.1, -0.2],
    action=action,
    valid=True,
    policy_version=0,
    observation=observation,
    skill_block=block,
  )


def _episode(group: int, won: bool, steps: list[tuple[str, str]], final: str = "") -> Episode:
  ep = Episode(env_index=0, task_id=0, group_id=group, won=won, reward=float(won))
  ep.turns = [_turn(o, a, prompt=f"<{o}>") for o, a in steps]
  ep.final_observation = final
  return ep


def _algo(context, **changes):
  return dataclasses.replace(get_preset("sdar"), context=context, **changes)


def _teacher_text(turn: Turn) -> str:
  """The teacher prompt's text before the student's prompt (asserting it ends with it)."""
  text, prompt = decode(turn.teacher_prompt_ids), decode(turn.prompt_ids)
  assert text.endswith(prompt)
  return text[: len(text) - len(prompt)]


def _compose(episodes, context, **changes):
  return compose_teacher_contexts(episodes, _algo(context, **changes), encode, decode)


def test_skills_source_is_the_recorded_block_before_the_student_prompt():
  ep = Episode(env_index=0, task_id=0, group_id=0)
  ep.turns = [_turn("o1", "a1", block="[Skills]\nbe kind\n\n"), _turn("o2", "a2", block=None)]
  counts = _compose([ep], "skills")
  assert ep.turns[0].teacher_prompt_ids == encode("[Skills]\nbe kind\n\n") + encode("P")
  # no block recorded: no context, the teacher prompt is the student's
  assert ep.turns[1].teacher_prompt_ids == encode("P") and not ep.turns[1].teacher_context
  metrics = context_metrics(counts)
  assert metrics["context/with_context_share"] == 0.5
  assert metrics["context/skills/tokens_mean"] == len("[Skills]\nbe kind\n\n")
  assert metrics["context/without_context"] == 1.0


def test_sibling_is_the_groups_first_other_success_as_a_worked_example():
  lost = _episode(0, False, [("kitchen", "go to fridge"), ("fridge", "open fridge")])
  first = _episode(0, True, [("kitchen", "take egg")])
  second = _episode(0, True, [("hall", "look"), ("kitchen", "take egg")])
  other_group = _episode(1, True, [("garden", "dig")])
  _compose([lost, first, second, other_group], "sibling")
  want_first = (
    "[Worked example: another attempt at this same task that succeeded]\n"
    "Observation: kitchen\nAction: take egg\n"
    "[End of example]\n\n"
  )
  want_second = (
    "[Worked example: another attempt at this same task that succeeded]\n"
    "Observation: hall\nAction: look\n"
    "Observation: kitchen\nAction: take egg\n"
    "[End of example]\n\n"
  )
  # the lost episode and the second success are shown the first success; the first success
  # (never its own) the second; every turn of an episode the same example
  assert [_teacher_text(t) for t in lost.turns] == [want_first, want_first]
  assert [_teacher_text(t) for t in second.turns] == [want_first, want_first]
  assert _teacher_text(first.turns[0]) == want_second
  # the only success of its group has no other success: no context
  assert not other_group.turns[0].teacher_context
  assert other_group.turns[0].teacher_prompt_ids == other_group.turns[0].prompt_ids


def test_a_group_without_a_success_has_no_sibling_context():
  group = [_episode(3, False, [("a", "x"), ("b", "y")]) for _ in range(3)]
  counts = _compose(group, "sibling")
  assert not any(t.teacher_context for ep in group for t in ep.turns)
  assert all(t.teacher_prompt_ids == t.prompt_ids for ep in group for t in ep.turns)
  metrics = context_metrics(counts)
  assert metrics["context/with_context_share"] == 0.0 and metrics["context/without_context"] == 6


def test_the_sibling_budget_cuts_the_examples_steps_to_their_first_tokens():
  lost = _episode(0, False, [("kitchen", "look")])
  won = _episode(0, True, [("kitchen", "take egg"), ("fridge", "put egg")])
  counts = _compose([lost, won], "sibling", sibling=algos.Sibling(tokens=20))
  steps = "Observation: kitchen\nAction: take egg\nObservation: fridge\nAction: put egg"
  want = (
    "[Worked example: another attempt at this same task that succeeded]\n"
    f"{steps[:20]}\n[End of example]\n\n"
  )
  assert _teacher_text(lost.turns[0]) == want
  assert context_metrics(counts)["context/sibling/tokens_mean"] == len(want)


def test_hindsight_shows_the_next_k_observations_and_the_outcome():
  ep = _episode(0, False, [("o1", "a1"), ("o2", "a2"), ("o3", "a3")], final="o4")
  ep.reward = -0.5
  _compose([ep], "hindsight", hindsight=algos.Hindsight(k=2, outcome=True))
  head = "[Hindsight: what this episode went on to show after the current turn]\n"
  tail = "\nIn the end the episode failed (return -0.5).\n[End of hindsight]\n\n"
  assert [_teacher_text(t) for t in ep.turns] == [
    head + "Then: o2\nThen: o3" + tail,
    head + "Then: o3\nThen: o4" + tail,
    head + "Then: o4" + tail,  # the last turn: only the final observation follows
  ]


def test_feedback_is_hindsight_with_one_observation_and_a_one_turn_episode_gets_it():
  one = _episode(0, True, [("start", "open box")], final="The box is open.")
  silent = _episode(1, False, [("start", "wait")])  # no final observation recorded
  counts = _compose([one, silent], "hindsight")  # defaults: k = 1, no outcome (SDPO's feedback)
  assert _teacher_text(one.turns[0]) == (
    "[Hindsight: what this episode went on to show after the current turn]\n"
    "Then: The box is open.\n[End of hindsight]\n\n"
  )
  assert not silent.turns[0].teacher_context
  assert context_metrics(counts)["context/hindsight/share"] == 0.5


def test_the_hindsight_budget_cuts_the_observations():
  ep = _episode(0, False, [("o1", "a1")], final="a very long final observation")
  _compose([ep], "hindsight", hindsight=algos.Hindsight(tokens=12))
  assert "\nThen: a very\n[End of hindsight]" in _teacher_text(ep.turns[0])


def test_sources_compose_in_the_order_named_and_failed_or_empty_turns_are_skipped():
  ep = _episode(0, False, [("o1", "a1"), ("o2", "a2")], final="o3")
  for turn in ep.turns:
    turn.skill_block = "[S]\n\n"
  ep.turns[1].response_ids = []  # no response: no turn-sample
  failed = _episode(0, True, [("x", "y")])
  failed.env_error = "crashed"  # not a success the group can show, and no turn-samples
  counts = _compose([ep, failed], ["hindsight", "skills", "sibling"])
  assert _teacher_text(ep.turns[0]) == (
    "[Hindsight: what this episode went on to show after the current turn]\n"
    "Then: o2\n[End of hindsight]\n\n[S]\n\n"
  )
  assert ep.turns[0].context_sources == ("hindsight", "skills")
  assert ep.turns[1].teacher_prompt_ids is None and failed.turns[0].teacher_prompt_ids is None
  assert counts["turn_samples"] == 1 and counts["sibling/with_context"] == 0


def test_templates_from_a_file_replace_the_built_in_sections(tmp_path):
  path = tmp_path / "mine.md"
  path.write_text("my note\n[[hindsight_step]]\nNext: {observation}!\n")
  ep = _episode(0, False, [("o1", "a1")], final="o2")
  _compose([ep], "hindsight", context_templates=str(path))
  assert "\nNext: o2!\n" in _teacher_text(ep.turns[0])
  bad = tmp_path / "bad.md"
  bad.write_text("[[hindsite]]\nx\n")
  with pytest.raises(ValueError, match=r"unknown sections \['hindsite'\]"):
    _compose([ep], "hindsight", context_templates=str(bad))


def test_a_registered_source_is_selectable_by_name():
  @algos.register_context_source("test_echo")
  def echo(request):
    return [f"[{t.action}]" for t in request.episode.turns]

  try:
    ep = _episode(0, False, [("o1", "a1")])
    _compose([ep], "test_echo")
    assert _teacher_text(ep.turns[0]) == "[a1]"
  finally:
    algos.TEACHER_CONTEXTS.unregister("test_echo")


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"context": "sibling,hindsigt"}, "'hindsigt' is not a teacher context source. Fix: use"),
    ({"context": ""}, "algo.context='': no source named. Fix:"),
    ({"context": "sibling,sibling"}, "a source named twice"),
    ({"hindsight": algos.Hindsight(k=0)}, "algo.hindsight.k=0: must be an integer >= 1. Fix:"),
    ({"sibling": {"tokens": 2.5}}, "algo.sibling.tokens=2.5: must be an integer >= 1"),
    ({"hindsight": {"outcome": "yes"}}, "algo.hindsight.outcome='yes': must be True or False"),
  ],
)
def test_bad_context_settings_are_refused_naming_the_value_and_the_fix(changes, message):
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
    dataclasses.replace(get_preset("sdar"), **changes)


def test_context_lists_are_hashable_and_the_default_is_the_skills_source():
  assert get_preset("sdar").context_names == ("skills",)
  algo = algos.AlgoConfig.from_config(
    {**dataclasses.asdict(get_preset("sdar")), "context": ["sibling", "hindsight"]}
  )
  assert algo.context_names == ("sibling", "hindsight") and hash(algo)
  assert not algo.records_skill_block and get_preset("sdar").records_skill_block


def test_sdpos_reprompt_is_the_demonstration_else_the_feedback():
  lost = _episode(0, False, [("kitchen", "look")], final="Nothing happens.")
  won = _episode(0, True, [("kitchen", "take egg")], final="You take the egg.")
  alone = _episode(1, False, [("hall", "look")], final="You see a door.")
  _compose([lost, won, alone], "sibling_or_hindsight")
  assert _teacher_text(lost.turns[0]).startswith("[Worked example")  # a success of the group
  # the group's only success has no other success to see: its feedback, as a group without one
  assert _teacher_text(won.turns[0]).endswith("Then: You take the egg.\n[End of hindsight]\n\n")
  assert _teacher_text(alone.turns[0]).endswith("Then: You see a door.\n[End of hindsight]\n\n")
