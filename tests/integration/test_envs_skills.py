"""Skill files and the retrieval strategies (rules before/after the fix, bm25, random, none)."""

import os
import re
import subprocess
import sys

import pytest

from envs.alfworld.tasks import TASK_TYPES
from envs.skills import (
  BLOCK_HEADER,
  SkillLibrary,
  SkillRetriever,
  check_teacher_blocks,
  skills_dir,
)
from tests.helpers import TEST_GENERAL_SKILLS, TEST_HEAT_GAME, TEST_HEAT_SKILLS, write_skills_folder

ALFWORLD = skills_dir("alfworld")
# Which task file the fixed rules must pick for each task type (from the reference mapping).
EXPECTED_SKILL = {
  "pick_and_place_simple": "pick_and_place",
  "look_at_obj_in_light": "look_at_obj_in_light",
  "pick_clean_then_place_in_recep": "clean",
  "pick_heat_then_place_in_recep": "heat",
  "pick_cool_then_place_in_recep": "cool",
  "pick_two_obj_and_place": "pick_and_place",
}
FILES = {
  "general": "general_skills.md",
  "pick_and_place": "pick_and_place.md",
  "look_at_obj_in_light": "look_at_obj_in_light.md",
  "clean": "clean.md",
  "heat": "heat.md",
  "cool": "cool.md",
}


def _read(name):
  with open(os.path.join(ALFWORLD, FILES[name])) as f:
    return f.read().strip()


def _game(task_type):
  return f"/data/json_2.1.1/train/{task_type}-Apple-None-CounterTop-12/trial_T2019/game.tw-pddl"


@pytest.mark.parametrize("name", list(FILES))
def test_skill_files_follow_the_format(name):
  lines = _read(name).splitlines()
  header = "### GENERAL SKILLS ###" if name == "general" else f"### TASK: {name} ###"
  assert lines[0] == header and lines[1] and not lines[2]
  items = [line for line in lines[3:] if line]
  assert len(items) >= 5 and all(
    re.match(rf"{n}\. [^:]+: .+ Apply this ", item) for n, item in enumerate(items, 1)
  )


def test_library_parses_every_item():
  library = SkillLibrary.load("alfworld")
  assert len(library.general.items) == 12
  assert list(library.tasks) == [n for n in FILES if n != "general"]
  assert len(library.all_items()) == sum(len(_read(n).splitlines()) - 3 for n in FILES)


def _block(text):
  return f"{BLOCK_HEADER}{text}\n\n"


def test_rules_before_the_fix_give_general_skills_only():
  retriever = SkillRetriever("alfworld", strategy="rules", rules_version="pre_fix")
  for task_type in TASK_TYPES:
    assert retriever.privileged_block(task_type=task_type, gamefile=_game(task_type)) == _block(
      _read("general")
    )


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_rules_after_the_fix_add_the_matching_task_file(task_type):
  retriever = SkillRetriever("alfworld", strategy="rules", rules_version="post_fix")
  expected = _block(_read("general") + "\n\n" + _read(EXPECTED_SKILL[task_type]))
  assert retriever.privileged_block(gamefile=_game(task_type)) == expected
  assert retriever.privileged_block(task_type=task_type) == expected


def test_rules_after_the_fix_fall_back_to_keywords_then_general():
  retriever = SkillRetriever("alfworld", strategy="rules", rules_version="post_fix")
  both = retriever.skill_text(query="Your task is to: heat some egg and put it in the cool fridge.")
  assert both == _read("general") + "\n\n" + _read("heat") + "\n\n" + _read("cool")
  assert retriever.skill_text(query="Your task is to: put a mug in cabinet.") == _read("general")
  assert retriever.skill_text(gamefile="/somewhere/game.tw-pddl") == _read("general")


@pytest.mark.parametrize("rules_version", ["pre_fix", "post_fix"])
def test_skill_grpo_student_block_is_the_keyword_rule_over_the_message(rules_version):
  retriever = SkillRetriever("alfworld", strategy="rules", rules_version=rules_version)
  message = "Your task is to: put a clean cloth in drawer. You see a desklamp 1."
  # The message names "clean" only; the game file (a cool task) and rules_version are not used.
  block = retriever.student_block(message, gamefile=_game("pick_cool_then_place_in_recep"))
  assert block == _block(_read("general") + "\n\n" + _read("clean"))
  # Every matching task file, in keyword order; none matching: general only.
  both = retriever.student_block("look at the bowl under the desklamp, then heat it")
  assert both == _block(
    _read("general") + "\n\n" + _read("look_at_obj_in_light") + "\n\n" + _read("heat")
  )
  assert retriever.student_block("put a mug in cabinet.") == _block(_read("general"))
  # Other strategies select for the student as for the teacher.
  assert SkillRetriever("alfworld", strategy="none").student_block(message) == ""


def test_bm25_ranks_the_relevant_items_first():
  retriever = SkillRetriever("alfworld", strategy="bm25", top_k=3)
  text = retriever.skill_text(query="heat the potato with the microwave")
  numbered = [line for line in text.splitlines() if re.match(r"\d+\. ", line)]
  assert len(numbered) == 3
  # The three items that mention both "heat" and "microwave" are the heat file's, in rank order.
  assert text.startswith("### TASK: heat ###") and text.count("###") == 2
  assert all("microwave" in x.lower() and "heat" in x.lower() for x in numbered)
  lamp = retriever.skill_text(query="switch on the desklamp while holding the book")
  assert "### TASK: look_at_obj_in_light ###" in lamp
  assert retriever.skill_text(query="zzzz qqqq") == ""  # nothing relevant: no block
  assert retriever.privileged_block(query="zzzz") == ""


def test_random_is_seeded_and_draws_k_items():
  a = SkillRetriever("alfworld", strategy="random", top_k=4, seed=1)
  b = SkillRetriever("alfworld", strategy="random", top_k=4, seed=1)
  first = [a.skill_text(sample_id=i) for i in range(5)]
  assert first == [b.skill_text(sample_id=i) for i in range(5)]
  assert len(set(first)) > 1  # different samples get different draws
  assert all(len(re.findall(r"^\d+\. ", t, flags=re.M)) == 4 for t in first)
  other_seed = SkillRetriever("alfworld", strategy="random", top_k=4, seed=2)
  assert [other_seed.skill_text(sample_id=i) for i in range(5)] != first
  # Without a sample id the retriever's own seeded stream is used.
  assert [a.skill_text() for _ in range(3)] == [b.skill_text() for _ in range(3)]


def test_none_gives_an_empty_block():
  assert SkillRetriever("alfworld", strategy="none").privileged_block(task_type=TASK_TYPES[0]) == ""


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="'bm52'"):
    SkillRetriever("alfworld", strategy="bm52")
  with pytest.raises(ValueError, match="rules_version"):
    SkillRetriever("alfworld", rules_version="2026")
  with pytest.raises(FileNotFoundError, match="no_env"):
    SkillRetriever("no_env")


# --------------------------------------------------------------- the authors' folder layout
@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
  """The same two skill files in the authors' mapping layout and in ours."""
  root = tmp_path_factory.mktemp("skills")
  return {layout: write_skills_folder(root / layout, layout) for layout in ("authors", "ours")}


@pytest.mark.parametrize("layout", ["authors", "ours"])
@pytest.mark.parametrize("rules_version", ["pre_fix", "post_fix"])
def test_both_folder_layouts_give_the_same_blocks(layouts, layout, rules_version):
  library = SkillLibrary.load(layouts[layout])
  assert library.general.raw == TEST_GENERAL_SKILLS.strip()
  assert library.task_keywords == {"heat": ["hot", "heat"]}  # resolved to the skill
  retriever = SkillRetriever(library, strategy="rules", rules_version=rules_version)
  general, heat = TEST_GENERAL_SKILLS.strip(), TEST_HEAT_SKILLS.strip()
  want = general if rules_version == "pre_fix" else general + "\n\n" + heat
  assert retriever.privileged_block(gamefile=TEST_HEAT_GAME) == _block(want)
  # the keyword rule (no game file, no task type): the task sentence names "hot"
  keyword = retriever.skill_text(query="Your task is to: put a hot egg in the fridge.")
  assert keyword == want
  assert retriever.student_block("put a hot egg in the fridge.") == _block(general + "\n\n" + heat)
  assert retriever.privileged_block(gamefile="look_at_obj_in_light-Pen-1") == _block(general)


def test_an_empty_teacher_block_refuses_the_run_naming_folder_and_key(tmp_path, layouts):
  games = [TEST_HEAT_GAME, "look_at_obj_in_light-Pen-None-DeskLamp-3"]
  for layout in layouts.values():  # both layouts: every task gets the general skills
    for version in ("pre_fix", "post_fix"):
      check_teacher_blocks(SkillRetriever(layout, rules_version=version), games)
  # A general file under a name neither layout uses is not the general file.
  folder = write_skills_folder(tmp_path / "odd", "authors")
  mapping = os.path.join(folder, "skill_mapping.json")
  with open(mapping) as f:
    text = f.read().replace('"general_skills"', '"general_tips"')
  with open(mapping, "w") as f:
    f.write(text)
  pre = SkillRetriever(folder, rules_version="pre_fix")
  with pytest.raises(ValueError, match=r"env.skills.dir=.*odd.*'general_skills'.*strategy=none"):
    check_teacher_blocks(pre, games)
  post = SkillRetriever(folder, rules_version="post_fix")
  with pytest.raises(ValueError, match=r"1 task\(s\) \('look_at_obj_in_light-Pen"):
    check_teacher_blocks(post, games)  # the heat game still gets its task file
  check_teacher_blocks(SkillRetriever(folder, strategy="none"), games)  # a teacher without skills


def test_mapping_mistakes_name_the_key_and_the_fix(tmp_path):
  folder = write_skills_folder(tmp_path / "bad", "authors")
  mapping = os.path.join(folder, "skill_mapping.json")
  with open(mapping) as f:
    good = f.read()
  for old, new, message in (
    ('"pick_heat_then_place_in_recep": [', '"pick_hat": [', r"'pick_hat'.*Fix: key it by"),
    ('"heat": "heat.md"', '"heat": "warm.md"', r"warm.md.*does not exist"),
    (
      '"general_skills": "general_skills.md"',
      '"general_skills": "general_skills.md", "general": "general_skills.md"',
      r"general file twice",
    ),
  ):
    with open(mapping, "w") as f:
      f.write(good.replace(old, new, 1))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
      SkillLibrary.load(folder)


def test_envs_never_import_jax():
  code = (
    "import sys, envs, envs.alfworld, envs.skills\n"
    "from envs.skills import SkillRetriever\n"
    "SkillRetriever('alfworld', strategy='bm25').skill_text(query='heat an apple')\n"
    "envs.make('dummy')\n"
    "assert 'jax' not in sys.modules, 'jax was imported'\n"
  )
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_places_task_keeps_only_the_task_objects_entries():
  """places="task" cuts "Places by type:" to the entries naming a word of the task sentence
  (worked by hand on the shipped general skills), and leaves the rest of the text as written."""
  full = SkillRetriever("alfworld", "rules", "pre_fix").skill_text()
  cut = SkillRetriever("alfworld", "rules", "pre_fix", places="task")
  text = cut.skill_text(task="examine the alarmclock with the desklamp.")
  assert (
    "Places by type: alarmclock: tables; desklamp, floorlamp: sidetable, desk, dresser, " in text
  )
  assert "apple" not in text and "apple, egg, potato, tomato:" in full
  assert text.replace(re.search(r"Places by type: [^.]*\.", text).group(0), "") == full.replace(
    re.search(r"Places by type: [^.]*\.", full).group(0), ""
  )
  # no task sentence: nothing is cut; no entry names the task: the list goes, the rule stays
  assert cut.skill_text() == full
  none = cut.skill_text(task="go somewhere.")
  assert "Places by type" not in none and "Look where the object would really be" in none
  with pytest.raises(ValueError, match="places='some'"):
    SkillRetriever("alfworld", places="some")


def test_brief_skills_are_the_general_search_habits():
  """The demo's short library: three items copied verbatim from the general ALFWorld skills."""
  brief = SkillLibrary.load("alfworld_brief").general
  general = {item.text for item in SkillLibrary.load("alfworld").general.items}
  assert len(brief.items) == 3 and all(item.text in general for item in brief.items)
