"""ALFWorld prompt text (snapshots written by hand) and the output -> action projection rules."""

import pytest

from envs.alfworld.projection import project_action, project_actions
from envs.alfworld.prompts import build_prompt, format_admissible

INSTRUCTION = (
  "It is your turn to act. First reason step by step about the situation and what to do next, and "
  "enclose all of this reasoning in <think> </think> tags. Then pick exactly one admissible action for "
  "this step and write it inside <action> </action> tags."
)
PREAMBLE = (
  "You are an expert household agent acting in the text version of the ALFRED embodied environment."
)

FIRST_OBS = (
  "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
  "you see a cabinet 1, a fridge 1, and a microwave 1.\n\nYour task is to: put a hot apple in cabinet."
)


def test_first_turn_snapshot():
  prompt = build_prompt(
    "put a hot apple in cabinet.",
    [],
    FIRST_OBS,
    ["go to cabinet 1", "go to fridge 1", "help", "inventory"],
  )
  assert prompt == (
    f"{PREAMBLE}\n"
    f"Your current observation is: {FIRST_OBS}\n"
    "The admissible actions in the current situation are: ['go to cabinet 1'\n 'go to fridge 1'\n 'inventory'].\n"
    "\n"
    f"{INSTRUCTION}"
  )


def test_later_turn_snapshot_shows_the_last_two_records():
  history = [
    (FIRST_OBS, "go to fridge 1"),
    ("You arrive at fridge 1. The fridge 1 is closed.", "open fridge 1"),
    (
      "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1.",
      "take apple 1 from fridge 1",
    ),
  ]
  prompt = build_prompt(
    "put a hot apple in cabinet.",
    history,
    "You pick up the apple 1 from the fridge 1.",
    ["go to microwave 1", "help", "look"],
  )
  assert prompt == (
    f"{PREAMBLE} Your task is to: put a hot apple in cabinet.\n"
    "You have already taken 3 step(s). Here are the last 2 observation(s) and the action you took after each one:\n"
    "[Observation 2: 'You arrive at fridge 1. The fridge 1 is closed.', Action 2: 'open fridge 1']\n"
    "[Observation 3: 'You open the fridge 1. The fridge 1 is open. In it, you see a apple 1.', "
    "Action 3: 'take apple 1 from fridge 1']\n"
    "You are now at step 4 and your current observation is: You pick up the apple 1 from the fridge 1.\n"
    "The admissible actions in the current situation are: ['go to microwave 1'\n 'look'].\n"
    "\n"
    f"{INSTRUCTION}"
  )


def test_second_turn_and_truncated_history_numbering():
  one = build_prompt("t.", [("obs a", "look")], "obs b", ["look"])
  assert "already taken 1 step(s)" in one and "the last 1 observation(s)" in one
  assert "[Observation 1: 'obs a', Action 1: 'look']\nYou are now at step 2" in one
  # Only the last records are passed, with the true step count: numbering follows the step count.
  later = build_prompt("t.", [("obs y", "a"), ("obs z", "b")], "now", ["look"], step=10)
  assert (
    "[Observation 9: 'obs y', Action 9: 'a']\n[Observation 10: 'obs z', Action 10: 'b']" in later
  )
  assert "already taken 10 step(s)" in later and "at step 11" in later
  with pytest.raises(ValueError, match="smaller"):
    build_prompt("t.", [("a", "b"), ("c", "d")], "now", [], step=1)


def test_admissible_list_drops_help_only():
  assert format_admissible(["help", "look", "helping hand"]) == "'look'\n 'helping hand'"


@pytest.mark.parametrize(
  "text, expected",
  [
    (
      "<think>the apple is in the fridge</think><action>Go To Fridge 1</action>",
      ("go to fridge 1", True),
    ),
    ("<think>x</think>\n<action>  open fridge 1 \n</action> trailing", ("open fridge 1", True)),
    # first <action> ... first </action> after it
    ("<think>x</think><action>look</action><action>inventory</action>", ("look", True)),
    # think tags are required (and checked case-sensitively on the original text)
    ("<action>look</action>", ("look", False)),
    ("<think>x<action>look</action>", ("look", False)),
    ("<THINK>x</THINK><action>look</action>", ("look", False)),
    # any CJK character invalidates the format
    ("<think>去冰箱</think><action>go to fridge 1</action>", ("go to fridge 1", False)),
    # action tags in any case
    ("<think>x</think><ACTION>look</ACTION>", ("look", True)),
    # well-formed but inadmissible is still format-valid
    ("<think>x</think><action>dance</action>", ("dance", True)),
  ],
)
def test_projection(text, expected):
  assert project_action(text) == expected


def test_missing_action_tags_send_the_last_30_characters():
  text = "<think>I will open the fridge</think> then I Open The Fridge 1 right away"
  assert project_action(text) == (text.lower()[-30:], False)
  assert project_action("short") == ("short", False)
  # An unclosed tag, or a closing tag only before the opening one, counts as missing.
  assert project_action("<think>x</think><action>look")[1] is False
  assert project_action("<think>x</think></action>look<action>")[1] is False


def test_project_actions_batches():
  actions, valid = project_actions(["<think>a</think><action>look</action>", "oops"])
  assert actions == ["look", "oops"] and valid == [True, False]


# ----------------------------------------------------------------------- env.prompt_template
# A template file in the authors' placeholder format (str.format names), in our own words.
TEMPLATE_FILE = """\
[[first_turn]]
Household robot here. Now I see: {current_observation}
Allowed: [{admissible_actions}]
Think in <think> </think>, act in <action> </action>.
[[later_turns]]
Goal: {task_description}. Steps done: {step_count}; last {history_length}:
{action_history}
Step {current_step}, I see: {current_observation}
Allowed: [{admissible_actions}]
Think in <think> </think>, act in <action> </action>.
[[skill_header]]
== Hints ==
"""


def test_prompt_template_file_replaces_the_wording_not_the_formats(tmp_path):
  from envs.alfworld import AlfworldAdapter
  from envs.base import EpisodeView
  from envs.prompt_template import apply_prompt_template
  from envs.skills import SkillRetriever

  path = tmp_path / "alfworld.txt"
  path.write_text(TEMPLATE_FILE)
  adapter, retriever = AlfworldAdapter(), SkillRetriever("alfworld_brief")
  apply_prompt_template(str(path), adapter, retriever)
  history = [(FIRST_OBS, "go to fridge 1"), ("You arrive at fridge 1.", "open fridge 1")]
  view = EpisodeView(
    task="put a hot apple in cabinet.",
    task_type="pick_heat_then_place_in_recep",
    gamefile="",
    history=history,
    observation="You open the fridge 1.",
    admissible=["take apple 1 from fridge 1", "help"],
  )
  assert adapter.user_text(view, 1) == (
    "Goal: put a hot apple in cabinet.. Steps done: 2; last 1:\n"
    "[Observation 2: 'You arrive at fridge 1.', Action 2: 'open fridge 1']\n"
    "Step 3, I see: You open the fridge 1.\n"
    "Allowed: ['take apple 1 from fridge 1']\n"
    "Think in <think> </think>, act in <action> </action>.\n"
  )
  first = EpisodeView(**{**view.__dict__, "history": [], "observation": FIRST_OBS})
  assert adapter.user_text(first, 1).startswith(f"Household robot here. Now I see: {FIRST_OBS}\n")
  assert retriever.privileged_block(task_type="x").startswith("== Hints ==\n### GENERAL SKILLS")
  apply_prompt_template(None, AlfworldAdapter())  # unset: nothing changes


def test_prompt_template_mistakes_name_the_fix(tmp_path):
  from envs.prompt_template import PromptTemplate, load_prompt_template

  with pytest.raises(ValueError, match=r"unknown placeholder\(s\) \['obs'\].*Fix"):
    PromptTemplate.parse("Now: {obs}", "t.txt")
  with pytest.raises(ValueError, match=r"\[\[turn_one\]\].*Fix: use"):
    PromptTemplate.parse("[[turn_one]]\nx", "t.txt")
  with pytest.raises(FileNotFoundError, match="env.prompt_template='nowhere.txt'.*Fix"):
    load_prompt_template("nowhere.txt")
  one = PromptTemplate.parse("Task {task_description}; {{literal}}")
  assert one.first_turn == one.later_turns and one.skill_header is None
