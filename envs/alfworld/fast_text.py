"""Faster text generation for TextWorld's PDDL engine, same text.

Profiling an ALFWorld turn (textworld 1.7.0, tatsu 5.8.3) shows most of its time outside the game:
every `ContextSensitiveGrammar.derive` parses its start string with tatsu again, every rule
condition is parsed again by `Rule.parse_conjunctive_query`, and every symbol's context is
deep-copied (`copy_context`), entity infos included. A game's turn derives one feedback sentence
and one command per admissible action, so a 640-game evaluation spent more time parsing the same
few hundred strings than sampling the policy. Loading a game parses the grammar's ~70 rules again, and translates the PDDL problem with Fast
Downward four times (`PddlEnv.load` and `PddlEnv.reset` each build a `PddlState`, which translates
once plain and once optimized for the planner).

`install()` swaps six of TextWorld's and Fast Downward's module-level functions for equivalents:

- the text grammar's parser (`textgen._parse_and_convert`) keeps each parse and hands out a copy
  of its symbol tree (the derivation sets the symbols' contexts, so a shared tree would be
  mutated);
- `Rule.parse_conjunctive_query` keeps each parsed rule and hands out that same `Rule`: a rule is
  not changed after parsing (`State.all_assignments` only reads its preconditions and
  placeholders; nothing reads or writes its `_cache`);
- `copy_context` copies the `variables` and `mapping` dicts one level deep instead of deep-copying
  their values: the only writers are `query`'s `dict.update` on the copies, the values (entity
  infos, placeholders, variables) are only read (`{o.name}`, `{o.indefinite + ' ' + o.name}` in
  ALFWorld's grammar);
- the grammar's `deepcopy` (`Symbol.copy` and `ContextSensitiveGrammar.replace` copy symbols with
  it) copies a symbol tree's symbols and shares their context dicts: a context is never changed
  after it is built (derivations assign a symbol a new context, `query` updates only the dicts
  `copy_context` just made), while a deep copy also copied the game state a symbol's old context
  held, only for `Symbol.copy` to replace that context at once;
- `fast_downward.pddl2sas` keeps the translations of the last few (domain, problem, options) and
  hands out the kept task and SAS text (a `PddlState` only reads them: the task's actions, types,
  objects and initial atoms; each call sets every translation option it uses, so a skipped call
  leaves no stale option behind);
- the game logic's parser (`pddl.logic._parse_and_convert`, the game's action and text grammar,
  ~13 KB that a few dozen games share) keeps each parse and hands out the kept actions and grammar:
  `GameLogic` copies them into its own dict and rule lists, and the `Action` and `ProductionRule`
  objects are only read afterwards (a derivation copies a rule's symbols before it sets their
  contexts).

The games play the same: tests/integration/test_envs_alfworld.py plays generated games
with seeded random admissible actions under the stock functions and under these and compares
every observation, admissible command list and win flag. `uninstall()` puts the stock functions
back; `SDAR_STOCK_TEXTWORLD=1` in the environment keeps them (to rule this module out).
"""

from __future__ import annotations

import copy
import functools
import os
import threading
from typing import Any

__all__ = ["install", "uninstall", "installed", "ENV_FLAG"]

ENV_FLAG = "SDAR_STOCK_TEXTWORLD"
_LOCK = threading.Lock()
_STOCK: dict[str, Any] = {}
_CACHE_SIZE = 65536  # distinct strings: ALFWorld's grammar has a few hundred, the task lines vary
_GAMES_KEPT = 16  # translations: an env pool worker plays a few games at a time
_GRAMMARS_KEPT = 64  # game logics: 18 distinct among 200 held-out games


def installed() -> bool:
  return bool(_STOCK)


def install() -> bool:
  """Installs the fast paths (once per process; idempotent); returns whether they are installed
  (False when `SDAR_STOCK_TEXTWORLD` is set)."""
  if os.environ.get(ENV_FLAG, "") not in ("", "0"):
    return False
  with _LOCK:
    if _STOCK:
      return True
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    parse_symbols = textgen._parse_and_convert
    parse_query = Rule.parse_conjunctive_query.__func__

    def copy_symbols(tree: Any, memo: dict | None = None) -> Any:
      """A symbol, or a list of them, as new objects all the way down; each symbol's context is
      the original's dict (anything else is deep-copied as `copy.deepcopy` would)."""
      if isinstance(tree, list):
        return [copy_symbols(x) for x in tree]
      if isinstance(tree, textgen.Symbol):
        new = object.__new__(type(tree))
        for name, value in tree.__dict__.items():
          new.__dict__[name] = value if name == "context" else copy_symbols(value)
        return new
      if isinstance(tree, (str, int, float, bool, type(None))):
        return tree
      return copy.deepcopy(tree, memo)

    @functools.lru_cache(maxsize=_CACHE_SIZE)
    def kept_symbols(text: str, rule_name: str, trace: bool) -> Any:
      return parse_symbols(text, rule_name=rule_name, trace=trace)

    def fast_parse_and_convert(text: str, rule_name: str = "symbols", trace: bool = False) -> Any:
      return copy_symbols(kept_symbols(text, rule_name, bool(trace)))

    @functools.lru_cache(maxsize=_CACHE_SIZE)
    def fast_parse_conjunctive_query(cls: type, expr: str) -> Any:
      return parse_query(Rule, expr)

    translate = fast_downward.pddl2sas

    @functools.lru_cache(maxsize=_GAMES_KEPT)
    def kept_translation(domain: str, problem: str, verbose: bool, optimize: bool) -> Any:
      return translate(domain, problem, verbose=verbose, optimize=optimize)

    def fast_pddl2sas(domain: str, problem: str, verbose: bool = False, optimize: bool = False):
      return kept_translation(domain, problem, bool(verbose), bool(optimize))

    parse_logic = pddl_logic._parse_and_convert

    @functools.lru_cache(maxsize=_GRAMMARS_KEPT)
    def kept_logic(text: str, rule_name: str) -> Any:
      return parse_logic(text, rule_name=rule_name)

    def fast_parse_logic(text: str, rule_name: str = "pddlStart", **options: Any) -> Any:
      return (
        parse_logic(text, rule_name=rule_name, **options)
        if options
        else kept_logic(text, rule_name)
      )

    def fast_copy_context(context: dict[str, Any]) -> dict[str, Any]:
      return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
      }

    _STOCK.update(
      parse=parse_symbols,
      query=Rule.__dict__["parse_conjunctive_query"],
      copy=textgen.copy_context,
      deepcopy=textgen.deepcopy,
      translate=translate,
      logic=parse_logic,
    )
    fast_downward.pddl2sas = fast_pddl2sas
    pddl_logic._parse_and_convert = fast_parse_logic
    textgen._parse_and_convert = fast_parse_and_convert
    textgen.copy_context = fast_copy_context
    textgen.deepcopy = copy_symbols
    Rule.parse_conjunctive_query = classmethod(fast_parse_conjunctive_query)
    return True


def uninstall() -> None:
  """Puts TextWorld's stock functions back (tests compare the two)."""
  with _LOCK:
    if not _STOCK:
      return
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    fast_downward.pddl2sas = _STOCK["translate"]
    pddl_logic._parse_and_convert = _STOCK["logic"]
    textgen._parse_and_convert = _STOCK["parse"]
    textgen.copy_context = _STOCK["copy"]
    textgen.deepcopy = _STOCK["deepcopy"]
    Rule.parse_conjunctive_query = _STOCK["query"]
    _STOCK.clear()
