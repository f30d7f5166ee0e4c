"""What an ALFRED-style household contains: rooms, receptacles, objects and where objects may go.

Type names follow ALFRED's CamelCase object classes (the engine lower-cases them: "CounterTop" is
shown as "countertop 1"). The tables are our own description of ordinary households, written for
the offline generator; they are plain data, read by `generator.py`.
"""

from __future__ import annotations

import dataclasses

__all__ = [
  "ObjectKind",
  "RoomKind",
  "OBJECTS",
  "ROOMS",
  "ROOM_SIZES",
  "OPENABLE",
  "LAMPS",
  "STATE_RECEPTACLE",
  "receptacle_id_stem",
  "scene_numbers",
]

# Room sizes of the generator: "full" draws each receptacle class's count from the room's (min,
# max) and 4-12 distractor kinds; "small" keeps at most one receptacle of each class and 2-4
# distractor kinds (8-12 receptacles instead of up to 35), for models small enough to train on a CPU.
ROOM_SIZES = ("full", "small")

# Receptacles that start closed and must be opened before looking inside or putting something in.
OPENABLE = frozenset({"Cabinet", "Drawer", "Fridge", "Microwave", "Safe"})

# The appliance each state-change task needs (CleanObject/HeatObject/CoolObject preconditions of the domain).
STATE_RECEPTACLE = {"clean": "SinkBasin", "heat": "Microwave", "cool": "Fridge"}

LAMPS = ("DeskLamp", "FloorLamp")

_TABLES = (
  "CounterTop",
  "DiningTable",
  "Desk",
  "SideTable",
  "CoffeeTable",
  "Dresser",
  "TVStand",
  "Shelf",
  "Cart",
)
_SEATS = ("Bed", "Sofa", "ArmChair", "Ottoman")


@dataclasses.dataclass(frozen=True)
class ObjectKind:
  """An object class: the receptacle classes it may rest in and which state changes apply to it."""

  name: str
  places: tuple[str, ...]
  heatable: bool = False
  coolable: bool = False
  cleanable: bool = False
  lookable: bool = False  # a sensible thing to examine under a lamp


def _kind(
  name: str,
  *places: str | tuple[str, ...],
  heat: bool = False,
  cool: bool = False,
  clean: bool = False,
  look: bool = False,
) -> ObjectKind:
  flat: list[str] = []
  for p in places:
    flat.extend(p if isinstance(p, tuple) else (p,))
  return ObjectKind(name, tuple(dict.fromkeys(flat)), heat, cool, clean, look)


_FOOD_PLACES = (_TABLES, "Fridge", "Microwave", "SinkBasin", "GarbageCan")
_DISH_PLACES = (_TABLES, "Cabinet", "Fridge", "Microwave", "SinkBasin")
_UTENSIL_PLACES = (_TABLES, "Drawer", "SinkBasin")
_SMALL_PLACES = (_TABLES, "Drawer", "Cabinet", "Safe")

OBJECTS: dict[str, ObjectKind] = {
  k.name: k
  for k in (
    # food
    _kind("Apple", _FOOD_PLACES, heat=True, cool=True, clean=True),
    _kind("Bread", _TABLES, "Fridge", "Microwave", "GarbageCan", "Cabinet", heat=True, cool=True),
    _kind("Egg", _FOOD_PLACES, heat=True, cool=True, clean=True),
    _kind("Potato", _FOOD_PLACES, heat=True, cool=True, clean=True),
    _kind("Tomato", _FOOD_PLACES, heat=True, cool=True, clean=True),
    _kind("Lettuce", _TABLES, "Fridge", "SinkBasin", "GarbageCan", cool=True, clean=True),
    # dishes and cookware
    _kind("Mug", _DISH_PLACES, "CoffeeMachine", heat=True, cool=True, clean=True, look=True),
    _kind("Cup", _DISH_PLACES, heat=True, cool=True, clean=True),
    _kind("Bowl", _DISH_PLACES, cool=True, clean=True, look=True),
    _kind("Plate", _DISH_PLACES, heat=True, cool=True, clean=True, look=True),
    _kind("Pan", _TABLES, "Cabinet", "Fridge", "SinkBasin", "StoveBurner", cool=True, clean=True),
    _kind("Pot", _TABLES, "Cabinet", "Fridge", "SinkBasin", "StoveBurner", cool=True, clean=True),
    _kind("Kettle", _TABLES, "Cabinet", "StoveBurner"),
    # utensils
    _kind("Fork", _UTENSIL_PLACES, clean=True),
    _kind("Spoon", _UTENSIL_PLACES, clean=True),
    _kind("Knife", _UTENSIL_PLACES, clean=True),
    _kind("ButterKnife", _UTENSIL_PLACES, clean=True),
    _kind("Spatula", _UTENSIL_PLACES, clean=True),
    _kind("Ladle", _UTENSIL_PLACES, clean=True),
    _kind("DishSponge", _UTENSIL_PLACES, "Cabinet", clean=True),
    # kitchen odds and ends
    _kind("SaltShaker", _TABLES, "Cabinet", "Drawer"),
    _kind("PepperShaker", _TABLES, "Cabinet", "Drawer"),
    _kind("WineBottle", _TABLES, "Cabinet", "Fridge", "GarbageCan", cool=True),
    _kind("SoapBottle", _TABLES, "Cabinet", "Toilet", "GarbageCan"),
    _kind("PaperTowelRoll", _TABLES, "Cabinet", "GarbageCan"),
    # bedroom and living room
    _kind("AlarmClock", _TABLES, look=True),
    _kind("Book", _SMALL_PLACES, _SEATS, look=True),
    _kind("CD", _SMALL_PLACES, "GarbageCan", look=True),
    _kind("CellPhone", _SMALL_PLACES, _SEATS, look=True),
    _kind("CreditCard", _SMALL_PLACES, _SEATS, look=True),
    _kind("KeyChain", _SMALL_PLACES, _SEATS, look=True),
    _kind("Laptop", _TABLES, _SEATS, look=True),
    _kind("Pen", _TABLES, "Drawer", "GarbageCan", look=True),
    _kind("Pencil", _TABLES, "Drawer", "GarbageCan", look=True),
    _kind("Pillow", _SEATS, look=True),
    _kind("RemoteControl", _TABLES, _SEATS, "Drawer", look=True),
    _kind("Newspaper", _TABLES, _SEATS, "GarbageCan", look=True),
    _kind("Statue", _TABLES, "Cabinet", "Safe", look=True),
    _kind("Vase", _TABLES, "Cabinet", "Safe", look=True),
    _kind("Watch", _TABLES, "Drawer", "Safe", look=True),
    _kind("Box", _TABLES, _SEATS, "Cabinet", look=True),
    _kind("TeddyBear", _SEATS, _TABLES, look=True),
    _kind("TissueBox", _TABLES, "Cabinet", "Toilet", "GarbageCan"),
    # bathroom
    _kind("Candle", _TABLES, "Cabinet", "Drawer", "Toilet"),
    _kind(
      "Cloth",
      _TABLES,
      "Cabinet",
      "Drawer",
      "SinkBasin",
      "BathtubBasin",
      "GarbageCan",
      "LaundryHamper",
      clean=True,
    ),
    _kind(
      "SoapBar",
      _TABLES,
      "Cabinet",
      "Drawer",
      "SinkBasin",
      "BathtubBasin",
      "Toilet",
      "GarbageCan",
      clean=True,
    ),
    _kind("SprayBottle", _TABLES, "Cabinet", "Toilet", "GarbageCan"),
    _kind("ToiletPaper", _TABLES, "Cabinet", "Drawer", "Toilet", "ToiletPaperHanger", "GarbageCan"),
    _kind("HandTowel", "HandTowelHolder", _TABLES),
    _kind("Towel", "TowelHolder", _TABLES, "LaundryHamper"),
  )
}


@dataclasses.dataclass(frozen=True)
class RoomKind:
  """A room type: receptacle classes with (min, max) counts, the object classes found there,
  its lamp (None: no look tasks here), ALFRED-like scene numbers and those held out as unseen."""

  name: str
  receptacles: dict[str, tuple[int, int]]
  objects: tuple[str, ...]
  lamp_holders: tuple[str, ...] = ()
  first_scene: int = 1
  num_scenes: int = 30
  num_unseen: int = 4


ROOMS: dict[str, RoomKind] = {
  r.name: r
  for r in (
    RoomKind(
      "kitchen",
      {
        "CounterTop": (1, 3),
        "Cabinet": (3, 12),
        "Drawer": (2, 9),
        "Fridge": (1, 1),
        "Microwave": (1, 1),
        "SinkBasin": (1, 1),
        "StoveBurner": (2, 4),
        "CoffeeMachine": (1, 1),
        "Toaster": (0, 1),
        "GarbageCan": (1, 1),
        "DiningTable": (0, 2),
        "Shelf": (0, 3),
      },
      (
        "Apple",
        "Bread",
        "Egg",
        "Potato",
        "Tomato",
        "Lettuce",
        "Mug",
        "Cup",
        "Bowl",
        "Plate",
        "Pan",
        "Pot",
        "Kettle",
        "Fork",
        "Spoon",
        "Knife",
        "ButterKnife",
        "Spatula",
        "Ladle",
        "DishSponge",
        "SaltShaker",
        "PepperShaker",
        "WineBottle",
        "SoapBottle",
        "PaperTowelRoll",
        "CreditCard",
        "Vase",
      ),
      first_scene=1,
    ),
    RoomKind(
      "livingroom",
      {
        "Sofa": (1, 1),
        "ArmChair": (0, 2),
        "CoffeeTable": (0, 1),
        "SideTable": (1, 3),
        "TVStand": (0, 1),
        "Dresser": (0, 1),
        "Drawer": (0, 6),
        "Cabinet": (0, 4),
        "Shelf": (0, 4),
        "GarbageCan": (1, 1),
        "DiningTable": (0, 1),
        "Ottoman": (0, 1),
        "Safe": (0, 1),
      },
      (
        "Book",
        "Box",
        "CellPhone",
        "CreditCard",
        "KeyChain",
        "Laptop",
        "Newspaper",
        "Pillow",
        "RemoteControl",
        "Statue",
        "Vase",
        "Watch",
        "TissueBox",
        "Plate",
        "Bowl",
        "Candle",
      ),
      lamp_holders=("SideTable", "Dresser", "TVStand", "CoffeeTable"),
      first_scene=201,
    ),
    RoomKind(
      "bedroom",
      {
        "Bed": (1, 1),
        "Desk": (0, 1),
        "SideTable": (1, 2),
        "Dresser": (0, 1),
        "Drawer": (2, 8),
        "Shelf": (0, 6),
        "GarbageCan": (1, 1),
        "LaundryHamper": (0, 1),
        "Safe": (0, 1),
        "ArmChair": (0, 1),
      },
      (
        "AlarmClock",
        "Book",
        "CD",
        "CellPhone",
        "CreditCard",
        "KeyChain",
        "Laptop",
        "Pen",
        "Pencil",
        "Pillow",
        "Mug",
        "Bowl",
        "Box",
        "TeddyBear",
        "Cloth",
        "Watch",
        "Vase",
      ),
      lamp_holders=("Desk", "SideTable", "Dresser"),
      first_scene=301,
    ),
    RoomKind(
      "bathroom",
      {
        "SinkBasin": (1, 2),
        "CounterTop": (1, 1),
        "Cabinet": (1, 4),
        "Drawer": (0, 4),
        "Toilet": (1, 1),
        "ToiletPaperHanger": (1, 1),
        "TowelHolder": (0, 1),
        "HandTowelHolder": (0, 2),
        "GarbageCan": (1, 1),
        "BathtubBasin": (0, 1),
        "Shelf": (0, 3),
        "Cart": (0, 1),
        "Dresser": (0, 1),
      },
      (
        "Candle",
        "Cloth",
        "HandTowel",
        "Towel",
        "SoapBar",
        "SoapBottle",
        "SprayBottle",
        "ToiletPaper",
        "TissueBox",
        "PaperTowelRoll",
      ),
      first_scene=401,
    ),
  )
}


def scene_numbers(room: RoomKind, unseen: bool) -> list[int]:
  """The room's scene numbers: the last `num_unseen` are held out for valid_unseen."""
  numbers = list(range(room.first_scene, room.first_scene + room.num_scenes))
  cut = room.num_scenes - room.num_unseen
  return numbers[cut:] if unseen else numbers[:cut]


def receptacle_id_stem(receptacle_type: str) -> tuple[str, str]:
  """(prefix, suffix) of a receptacle's PDDL id around its number.

  ALFRED names basins after their fixture ("Sink|...|SinkBasin") and alfworld's demangler relies on
  that: it keeps the part before the first "|" and appends "basin" when the id mentions one, so a
  sink basin must be written ``Sink_bar_<n>_bar_SinkBasin`` to be shown as "sinkbasin <n>".
  """
  if receptacle_type.endswith("Basin"):
    fixture = receptacle_type[: -len("Basin")]
    return fixture, f"_bar_{receptacle_type}"
  return receptacle_type, ""
