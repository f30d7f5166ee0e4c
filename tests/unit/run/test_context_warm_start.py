"""Teaching the context blocks in the warm start: the demonstration-following expert searches where
the demonstration found things first, and the SFT and gap samples carry exactly the blocks the
trainer composes (worked out by hand from the templates) before the rollout's student prompt."""

from envs.alfworld import build_prompt
from envs.alfworld.expert import SearchExpert, demonstration_places
from sdar_jax.algos.config import AlgoConfig
from sdar_jax.run import context_warm_start as cws
from sdar_jax.run.warm_start import _record_turns, _sample
from sdar_jax.text.chat_templates import ChatTemplate

ROOM = (
  "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a desk 1, "
  "a drawer 1, a drawer 2, a shelf 1, and a sidetable 1.\n\nYour task is to: look at pen under "
  "the desklamp."
)
PLACES = ["cabinet 1", "desk 1", "drawer 1", "drawer 2", "shelf 1", "sidetable 1"]


def _step(observation, action, random=False):
  admissible = [f"go to {p}" for p in PLACES] + [action]
  return {
    "observation": observation,
    "admissible_commands": list(dict.fromkeys(admissible)),
    "action": action,
    "random": random,
  }


# A won episode: the pen was in drawer 2, the lamp stood on sidetable 1.
DEMO = {
  "task": "look at pen under the desklamp.",
  "task_type": "look_at_obj_in_light",
  "gamefile": "g1",
  "task_index": 0,
  "mode": "plain",
  "won": True,
  "steps": [
    _step(ROOM, "go to drawer 2"),
    _step("You arrive at drawer 2. The drawer 2 is closed.", "open drawer 2"),
    _step("You open the drawer 2. In it, you see a pen 1.", "take pen 1 from drawer 2"),
    _step("You pick up the pen 1 from the drawer 2.", "go to sidetable 1"),
    _step("You arrive at sidetable 1. On it, you see a desklamp 1.", "use desklamp 1"),
  ],
  "final_observation": "You turn on the desklamp 1.",
}


def test_demonstration_places_are_read_from_the_actions_alone():
  assert demonstration_places(DEMO["steps"]) == {"pen": ["drawer 2"], "desklamp": ["sidetable 1"]}
  assert demonstration_places([]) == {}


def test_the_demo_expert_goes_first_where_the_demonstration_took_the_object():
  """The knowledge-free expert in room order starts at cabinet 1; the demonstration-following one
  goes to drawer 2, then (pen in hand) to sidetable 1 before any other place."""
  plain = SearchExpert(search_order="room")
  follower = SearchExpert(search_order="room", demonstration=DEMO["steps"])
  admissible = [f"go to {p}" for p in PLACES]
  assert plain.act(ROOM, admissible) == "go to cabinet 1"
  assert follower.act(ROOM, admissible) == "go to drawer 2"
  assert follower.mode == "demo" and follower.lamp_order[0] == "sidetable 1"


def test_play_demonstrations_follows_the_first_won_record_of_each_game():
  lost = dict(DEMO, gamefile="g2", task_index=1, won=False)
  skills = dict(DEMO, mode="skills")  # the same game won again, later: not the one followed
  asked = []

  def play(tasks, demonstration):
    asked.append(tasks)
    return [
      {"gamefile": "g1", "mode": "demo", "won": True, "steps": demonstration({"gamefile": "g1"})}
    ]

  out = cws.play_demonstrations([DEMO, lost, skills], play)
  assert asked == [[0]]  # game g2 has no success: not replayed
  assert out[0]["demonstration"] is DEMO and out[0]["steps"] is DEMO["steps"]
  assert cws.play_demonstrations([lost], play) == []


def _plain(tok, record, k):
  steps = record["steps"]
  history = [(s["observation"], s["action"]) for s in steps[:k]][-2:]
  user = build_prompt(
    record["task"], history, steps[k]["observation"], steps[k]["admissible_commands"], step=k
  )
  return tok.encode(ChatTemplate.builtin("qwen3").render([{"role": "user", "content": user}]))


def _samples(source, records, loop, algo, for_gap):
  return cws.context_samples(
    source, records, loop, 7, algo, for_gap=for_gap, record_turns=_record_turns, make_sample=_sample
  )


def test_sibling_samples_put_the_demonstration_before_the_student_prompt(loop):
  tok = loop.tokenizer
  follower = {
    **DEMO,
    "mode": "demo",
    "demonstration": DEMO,
    "steps": [_step(ROOM, "go to drawer 2"), _step("Nothing happens.", "look", random=True)],
  }
  algo = AlgoConfig.from_config({"context": "sibling"})
  demo_lines = [f"Observation: {s['observation']}\nAction: {s['action']}" for s in DEMO["steps"]]
  block = (
    "[Worked example: another attempt at this same task that succeeded]\n"
    + "\n".join(demo_lines)
    + "\n[End of example]\n\n"
  )
  (sft,) = _samples("sibling", [follower, DEMO], loop, algo, for_gap=False)  # random turn: none
  assert sft.prompt_ids == tok.encode(block) + _plain(tok, follower, 0)
  assert tok.decode(sft.response_ids[:-1]).endswith("<action>go to drawer 2</action>")
  (gap,) = _samples("sibling", [follower], loop, algo, for_gap=True)
  assert gap.prompt_ids == _plain(tok, follower, 0) and gap.teacher_prompt_ids == sft.prompt_ids
  assert gap.score == 1.0  # a search turn
  cut = AlgoConfig.from_config({"context": "sibling", "sibling": {"tokens": 12}})
  (short,) = _samples("sibling", [follower], loop, cut, for_gap=False)
  steps_ids = tok.encode("\n".join(demo_lines))[:12]
  head = "[Worked example: another attempt at this same task that succeeded]\n"
  assert short.prompt_ids[: len(tok.encode(head))] == tok.encode(head)
  assert tok.decode(steps_ids) in tok.decode(short.prompt_ids)
  assert len(short.prompt_ids) < len(sft.prompt_ids)


def test_hindsight_samples_show_the_observation_each_action_led_to(loop):
  tok = loop.tokenizer
  algo = AlgoConfig.from_config({"context": "hindsight"})
  sft = _samples("hindsight", [DEMO], loop, algo, for_gap=False)
  assert len(sft) == 5  # the last turn sees the final observation
  for k, sample in enumerate(sft):
    after = DEMO["steps"][k + 1]["observation"] if k < 4 else DEMO["final_observation"]
    block = f"[Hindsight: what this episode went on to show after the current turn]\nThen: {after}\n[End of hindsight]\n\n"
    assert sample.prompt_ids == tok.encode(block) + _plain(tok, DEMO, k)
  no_final = {**DEMO, "final_observation": ""}
  assert len(_samples("hindsight", [no_final], loop, algo, for_gap=False)) == 4
  skills = {**DEMO, "mode": "skills"}  # the gap reads the knowledge-free expert's turns only
  assert _samples("hindsight", [skills], loop, algo, for_gap=True) == []
  assert len(_samples("hindsight", [skills], loop, algo, for_gap=False)) == 5


def test_warm_start_context_settings_are_checked():
  import ml_collections as mlc

  ok = mlc.ConfigDict({"contexts": "sibling,hindsight", "source": "expert", "measure": False})
  assert cws.setting_problems(ok) == []
  bad = mlc.ConfigDict({"contexts": "skills,future", "source": "walkthroughs", "measure": 1})
  problems = "\n".join(cws.setting_problems(bad))
  assert "'skills' cannot be taught or measured" in problems
  assert "'future' cannot be taught or measured" in problems
  assert "needs warm_start.source='expert'" in problems and "warm_start.measure=1" in problems
  no_memory = mlc.ConfigDict({"contexts": "skill_memory", "source": "expert", "memory": ""})
  assert "measures 'skill_memory' without a memory" in cws.setting_problems(no_memory)[0]
  missing = mlc.ConfigDict({"contexts": "skill_memory", "source": "expert", "memory": "/no/x.json"})
  assert "warm_start.memory='/no/x.json': no such file" in cws.setting_problems(missing)[0]


def test_reflection_is_measured_on_mixed_games_only_and_never_taught(loop):
  """A game with a success and a failure: every knowledge-free turn of it gets the oracle's prior
  (the won episode's "Do" lessons, the lost one's "Avoid" ones) as its block; a game won by every
  record gets none; no SFT sample."""
  tok = loop.tokenizer
  algo = AlgoConfig.from_config({"context": "reflection"})
  lost = {
    **DEMO,
    "won": False,
    "steps": [_step(ROOM, "go to shelf 1"), _step("You arrive at shelf 1.", "go to shelf 1")],
    "final_observation": "Nothing happens.",
  }
  gaps = _samples("reflection", [DEMO, lost], loop, algo, for_gap=True)
  assert len(gaps) == 5 + 2  # both records are the knowledge-free expert's
  block = tok.decode(gaps[5].teacher_prompt_ids[: -len(gaps[5].prompt_ids)])
  assert block.startswith("[Lessons drawn from this task's other attempts")
  assert "Do `use desklamp 1`: it finished the task." in block  # from the won episode
  assert "Avoid `go to shelf 1`: it changed nothing." in block  # from the lost one
  assert gaps[5].prompt_ids == _plain(tok, lost, 0)
  assert gaps[0].teacher_prompt_ids == tok.encode(block) + _plain(tok, DEMO, 0)
  assert _samples("reflection", [DEMO, {**DEMO, "mode": "skills"}], loop, algo, for_gap=True) == []
  assert _samples("reflection", [DEMO, lost], loop, algo, for_gap=False) == []


def test_a_runs_skill_memory_is_measured_on_the_turns_of_its_task_only(loop, tmp_path):
  """A memory saved as a run saves it: its task skill for this task (none for the state pool)
  is every knowledge-free turn's block, exactly as the template writes it; a game of an unrelated
  task retrieves nothing (no sample); nothing is taught; a file that is no memory is refused."""
  import pytest

  from sdar_jax.algos.skill_memory import Memory, SkillMemory

  memory = Memory(SkillMemory())
  skill = {"title": "Lamp last", "principle": "Take the pen, then use the desklamp.",
           "when_to_apply": "Looking at a thing under a lamp."}  # fmt: skip
  memory.add("task", DEMO["task"], "", skill, iteration=0, source="oracle")
  other = {"title": "Heat first", "principle": "Heat the egg in the microwave first.",
           "when_to_apply": "Heating an egg for the garbagecan."}  # fmt: skip
  memory.add("task", "heat some egg and put it in garbagecan.", "", other, 0, "oracle")
  path = tmp_path / "skill_memory.json"
  path.write_text(memory.to_json())
  assert Memory.from_json(path.read_text()).state_dict() == memory.state_dict()

  tok = loop.tokenizer
  algo = AlgoConfig.from_config({"context": "skills"})
  unrelated = {**DEMO, "task": "cool a tomato.", "gamefile": "g3"}
  kwargs = dict(record_turns=_record_turns, make_sample=_sample, memory=str(path))
  gaps = cws.context_samples(
    "skill_memory", [DEMO, unrelated], loop, 7, algo, for_gap=True, **kwargs
  )
  block = (
    "[Skills kept from earlier attempts at tasks like this one: use one only where it fits what "
    "you see now]\nFor the task:\n- Lamp last: Take the pen, then use the desklamp. (when: "
    "Looking at a thing under a lamp.)\n[End of skills]\n\n"
  )
  assert len(gaps) == 5  # the unrelated game's turns get no block
  for k, sample in enumerate(gaps):
    assert sample.teacher_prompt_ids == tok.encode(block) + _plain(tok, DEMO, k)
  assert cws.context_samples("skill_memory", [DEMO], loop, 7, algo, for_gap=False, **kwargs) == []
  path.write_text('{"skills": []}')
  with pytest.raises(ValueError, match="warm_start.memory=.*not a skill memory written by a run"):
    cws.context_samples("skill_memory", [DEMO], loop, 7, algo, for_gap=True, **kwargs)
