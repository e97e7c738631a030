"""Write the demo's instruction set (examples/data/instructions.jsonl) from templates and facts
written for farmkit: arithmetic, unit conversions, word tasks, lists, rewriting, classification and
simple facts, each with a short demonstration a 135M model can learn a little from.

    python examples/make_instructions.py [-n 900] [--seed 0] [-o examples/data/instructions.jsonl]

Deterministic under --seed: the same arguments write the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Callable
from pathlib import Path

Record = dict[str, str]

# ---------------------------------------------------------------------------------------------
# Facts and word lists (written for this file)

NUMBER_WORDS = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
]

PLURALS = {
    "cat": "cats",
    "dog": "dogs",
    "box": "boxes",
    "bus": "buses",
    "child": "children",
    "mouse": "mice",
    "tooth": "teeth",
    "foot": "feet",
    "woman": "women",
    "man": "men",
    "city": "cities",
    "baby": "babies",
    "leaf": "leaves",
    "knife": "knives",
    "wolf": "wolves",
    "potato": "potatoes",
    "hero": "heroes",
    "sheep": "sheep",
    "fish": "fish",
    "goose": "geese",
    "person": "people",
    "church": "churches",
    "wish": "wishes",
    "story": "stories",
    "toy": "toys",
    "key": "keys",
    "book": "books",
    "glass": "glasses",
    "class": "classes",
    "party": "parties",
    "life": "lives",
    "shelf": "shelves",
    "photo": "photos",
    "piano": "pianos",
    "ox": "oxen",
    "cactus": "cacti",
    "day": "days",
    "lady": "ladies",
}

ANTONYMS = {
    "hot": "cold",
    "big": "small",
    "fast": "slow",
    "happy": "sad",
    "light": "dark",
    "old": "young",
    "early": "late",
    "open": "closed",
    "full": "empty",
    "hard": "soft",
    "high": "low",
    "strong": "weak",
    "rich": "poor",
    "near": "far",
    "wet": "dry",
    "loud": "quiet",
    "clean": "dirty",
    "thick": "thin",
    "cheap": "expensive",
    "easy": "difficult",
    "begin": "end",
    "win": "lose",
    "push": "pull",
    "buy": "sell",
    "remember": "forget",
    "friend": "enemy",
    "day": "night",
    "up": "down",
    "inside": "outside",
    "true": "false",
    "first": "last",
    "brave": "afraid",
    "tall": "short",
    "heavy": "light",
    "wide": "narrow",
}

SYNONYMS = {
    "big": "large",
    "small": "little",
    "happy": "glad",
    "fast": "quick",
    "begin": "start",
    "end": "finish",
    "smart": "clever",
    "angry": "mad",
    "tired": "sleepy",
    "pretty": "beautiful",
    "shut": "close",
    "choose": "pick",
    "help": "assist",
    "rich": "wealthy",
    "scared": "afraid",
    "quiet": "silent",
    "look": "see",
    "gift": "present",
    "house": "home",
    "job": "work",
}

CATEGORIES = {
    "fruits": [
        "apple",
        "banana",
        "orange",
        "grape",
        "pear",
        "mango",
        "cherry",
        "peach",
        "plum",
        "lemon",
    ],
    "vegetables": [
        "carrot",
        "potato",
        "onion",
        "pea",
        "spinach",
        "cabbage",
        "broccoli",
        "lettuce",
        "leek",
    ],
    "colors": [
        "red",
        "blue",
        "green",
        "yellow",
        "purple",
        "orange",
        "black",
        "white",
        "brown",
        "pink",
    ],
    "animals that live in the sea": [
        "whale",
        "dolphin",
        "shark",
        "octopus",
        "jellyfish",
        "seal",
        "crab",
        "starfish",
        "squid",
        "tuna",
    ],
    "musical instruments": [
        "piano",
        "guitar",
        "violin",
        "drum",
        "flute",
        "trumpet",
        "cello",
        "harp",
        "clarinet",
        "saxophone",
    ],
    "things found in a kitchen": [
        "stove",
        "fridge",
        "kettle",
        "pan",
        "spoon",
        "knife",
        "oven",
        "sink",
        "cutting board",
        "toaster",
    ],
    "sports": [
        "football",
        "tennis",
        "swimming",
        "basketball",
        "cycling",
        "running",
        "golf",
        "rowing",
        "volleyball",
        "skiing",
    ],
    "planets": ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"],
    "ways to save energy at home": [
        "turn off lights you are not using",
        "wash clothes in cold water",
        "unplug chargers",
        "close windows when the heating is on",
        "use a lid when cooking",
        "dry clothes on a line",
        "take shorter showers",
        "use energy-saving bulbs",
    ],
    "tips for a good night's sleep": [
        "go to bed at the same time every night",
        "keep the bedroom dark",
        "avoid screens before bed",
        "avoid coffee in the evening",
        "keep the room cool",
        "exercise during the day",
        "avoid heavy meals late at night",
    ],
    "tips for studying": [
        "study in short sessions",
        "take regular breaks",
        "test yourself",
        "explain the topic to a friend",
        "keep your desk tidy",
        "turn off your phone",
        "review your notes the next day",
    ],
}

ANIMAL_CLASSES = {
    "dog": "mammal",
    "cat": "mammal",
    "whale": "mammal",
    "bat": "mammal",
    "horse": "mammal",
    "elephant": "mammal",
    "dolphin": "mammal",
    "rabbit": "mammal",
    "eagle": "bird",
    "penguin": "bird",
    "owl": "bird",
    "parrot": "bird",
    "sparrow": "bird",
    "ostrich": "bird",
    "salmon": "fish",
    "shark": "fish",
    "trout": "fish",
    "goldfish": "fish",
    "tuna": "fish",
    "snake": "reptile",
    "lizard": "reptile",
    "crocodile": "reptile",
    "turtle": "reptile",
    "iguana": "reptile",
    "frog": "amphibian",
    "toad": "amphibian",
    "salamander": "amphibian",
    "newt": "amphibian",
}

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "Canada": "Ottawa",
    "Egypt": "Cairo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Norway": "Oslo",
    "Sweden": "Stockholm",
    "Greece": "Athens",
    "Ireland": "Dublin",
    "Portugal": "Lisbon",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "China": "Beijing",
    "India": "New Delhi",
    "Mexico": "Mexico City",
    "Argentina": "Buenos Aires",
    "Australia": "Canberra",
    "Russia": "Moscow",
    "Turkey": "Ankara",
    "Thailand": "Bangkok",
    "Chile": "Santiago",
    "Cuba": "Havana",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Brazil": "Brasilia",
    "Morocco": "Rabat",
}

SIMPLE_FACTS = [
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("How many legs does an insect have?", "An insect has six legs."),
    ("How many days are there in a week?", "There are seven days in a week."),
    ("How many months are there in a year?", "There are twelve months in a year."),
    ("How many minutes are there in an hour?", "There are 60 minutes in an hour."),
    ("How many hours are there in a day?", "There are 24 hours in a day."),
    (
        "What is the boiling point of water at sea level in Celsius?",
        "Water boils at 100 degrees Celsius at sea level.",
    ),
    ("What is the freezing point of water in Celsius?", "Water freezes at 0 degrees Celsius."),
    ("Which planet is closest to the Sun?", "Mercury is the planet closest to the Sun."),
    (
        "Which is the largest planet in the solar system?",
        "Jupiter is the largest planet in the solar system.",
    ),
    ("What gas do plants take in from the air to make food?", "Plants take in carbon dioxide."),
    ("What do bees make?", "Bees make honey and wax."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("How many sides does a triangle have?", "A triangle has three sides."),
    ("How many sides does a hexagon have?", "A hexagon has six sides."),
    ("What colour do you get by mixing blue and yellow?", "Mixing blue and yellow gives green."),
    ("What colour do you get by mixing red and white?", "Mixing red and white gives pink."),
    ("What is the opposite of north?", "The opposite of north is south."),
    ("Which season comes after winter?", "Spring comes after winter."),
    ("Which season comes after summer?", "Autumn comes after summer."),
    ("What do you call a baby cat?", "A baby cat is called a kitten."),
    ("What do you call a baby dog?", "A baby dog is called a puppy."),
    ("What do you call a baby cow?", "A baby cow is called a calf."),
    ("What organ pumps blood through the body?", "The heart pumps blood through the body."),
    ("How many continents are there?", "There are seven continents."),
    ("What is frozen water called?", "Frozen water is called ice."),
    (
        "Which animal is known as the king of the jungle?",
        "The lion is often called the king of the jungle.",
    ),
    (
        "How many players are on a football (soccer) team on the field?",
        "Each team has eleven players on the field.",
    ),
]

SUBJECTS = [
    "The cat",
    "My brother",
    "The teacher",
    "Anna",
    "The old man",
    "Our neighbour",
    "The children",
    "The farmer",
    "My friend",
    "The doctor",
]
# verb: (present third person, past, object phrases)
VERBS = {
    "eat": ("eats", "ate", ["an apple", "lunch", "some bread"]),
    "write": ("writes", "wrote", ["a letter", "a poem", "a short story"]),
    "see": ("sees", "saw", ["a bird", "the river", "a red car"]),
    "take": ("takes", "took", ["the bus", "a photo", "the dog for a walk"]),
    "make": ("makes", "made", ["a cake", "a plan", "tea"]),
    "read": ("reads", "read", ["a book", "the news", "a map"]),
    "buy": ("buys", "bought", ["milk", "a new coat", "flowers"]),
    "find": ("finds", "found", ["a coin", "the keys", "a lost cat"]),
    "paint": ("paints", "painted", ["the fence", "a picture", "the door"]),
    "clean": ("cleans", "cleaned", ["the kitchen", "the windows", "the car"]),
    "visit": ("visits", "visited", ["the museum", "a friend", "the market"]),
    "play": ("plays", "played", ["the piano", "football", "chess"]),
}
PLURAL_SUBJECTS = {"The children"}

POSITIVE_WORDS = [
    "wonderful",
    "delicious",
    "friendly",
    "beautiful",
    "excellent",
    "helpful",
    "lovely",
    "great",
]
NEGATIVE_WORDS = [
    "terrible",
    "boring",
    "rude",
    "awful",
    "poor",
    "disappointing",
    "a letdown",
    "too slow",
]
REVIEW_THINGS = [
    "The food",
    "The hotel room",
    "The film",
    "The service",
    "This phone",
    "The concert",
    "The staff",
    "The book",
]

# (unit from, unit to, factor)
CONVERSIONS = [
    ("kilometers", "meters", 1000),
    ("meters", "centimeters", 100),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
    ("dollars", "cents", 100),
    ("years", "months", 12),
]

# ---------------------------------------------------------------------------------------------
# One generator per kind of task; each returns a record drawn with `rng`.


def arithmetic(rng: random.Random) -> Record:
    op = rng.choice("+-*")
    if op == "*":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
    else:
        a, b = rng.randint(3, 99), rng.randint(2, 99)
        if op == "-" and b > a:
            a, b = b, a
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    symbol = {"+": "+", "-": "-", "*": "x"}[op]
    style = rng.randrange(3)
    if style == 0:
        return {
            "instruction": f"What is {a} {symbol} {b}?",
            "input": "",
            "output": f"{a} {symbol} {b} = {result}.",
        }
    if style == 1:
        return {
            "instruction": "Solve the arithmetic problem.",
            "input": f"{a} {symbol} {b}",
            "output": f"The answer is {result}.",
        }
    noun = rng.choice(["apples", "books", "coins", "marbles", "stamps"])
    if op == "+":
        story = f"Sam has {a} {noun} and gets {b} more. How many {noun} does Sam have now?"
        answer = f"Sam has {a} + {b} = {result} {noun}."
    elif op == "-":
        story = f"Sam has {a} {noun} and gives away {b}. How many {noun} are left?"
        answer = f"Sam has {a} - {b} = {result} {noun} left."
    else:
        story = f"There are {a} boxes with {b} {noun} in each. How many {noun} are there in total?"
        answer = f"There are {a} x {b} = {result} {noun} in total."
    return {"instruction": "Answer the word problem.", "input": story, "output": answer}


def conversion(rng: random.Random) -> Record:
    unit_from, unit_to, factor = rng.choice(CONVERSIONS)
    amount = rng.randint(2, 15)
    answer = f"{amount} {unit_from} is {amount * factor} {unit_to}."
    if rng.random() < 0.5:
        return {
            "instruction": f"Convert {amount} {unit_from} to {unit_to}.",
            "input": "",
            "output": answer,
        }
    return {
        "instruction": f"How many {unit_to} are there in {amount} {unit_from}?",
        "input": "",
        "output": answer,
    }


def plural(rng: random.Random) -> Record:
    words = rng.sample(sorted(PLURALS), rng.choice([1, 1, 3, 4]))
    if len(words) == 1:
        word = words[0]
        instruction = rng.choice(
            ["Give the plural form of the word.", "What is the plural of this noun?"]
        )
        return {
            "instruction": instruction,
            "input": word,
            "output": f'The plural of "{word}" is "{PLURALS[word]}".',
        }
    return {
        "instruction": "Write the plural form of each word.",
        "input": ", ".join(words),
        "output": "\n".join(f"{w}: {PLURALS[w]}" for w in words),
    }


def antonym(rng: random.Random) -> Record:
    word = rng.choice(sorted(ANTONYMS))
    if rng.random() < 0.5:
        return {
            "instruction": f'What is the opposite of "{word}"?',
            "input": "",
            "output": f'The opposite of "{word}" is "{ANTONYMS[word]}".',
        }
    return {
        "instruction": "Give an antonym for the word.",
        "input": word,
        "output": ANTONYMS[word].capitalize() + ".",
    }


def synonym(rng: random.Random) -> Record:
    word = rng.choice(sorted(SYNONYMS))
    return {
        "instruction": "Give a word that means the same as the word below.",
        "input": word,
        "output": f'A word that means "{word}" is "{SYNONYMS[word]}".',
    }


def list_items(rng: random.Random) -> Record:
    category = rng.choice(sorted(CATEGORIES))
    count = rng.randint(3, 5)
    count = min(count, len(CATEGORIES[category]))
    items = rng.sample(CATEGORIES[category], count)
    if rng.random() < 0.5:
        body = "\n".join(
            f"{i}. {item[0].upper() + item[1:]}" for i, item in enumerate(items, start=1)
        )
    else:
        body = "\n".join(f"- {item[0].upper() + item[1:]}" for item in items)
    return {"instruction": f"List {NUMBER_WORDS[count]} {category}.", "input": "", "output": body}


def past_tense(rng: random.Random) -> Record:
    subject = rng.choice(SUBJECTS)
    verb = rng.choice(sorted(VERBS))
    third, past, objects = VERBS[verb]
    thing = rng.choice(objects)
    present = f"{subject} {verb if subject in PLURAL_SUBJECTS else third} {thing}."
    return {
        "instruction": rng.choice(
            ["Rewrite the sentence in the past tense.", "Change this sentence to the past tense."]
        ),
        "input": present,
        "output": f"{subject} {past} {thing}.",
    }


def question_form(rng: random.Random) -> Record:
    subject = rng.choice([s for s in SUBJECTS if s not in PLURAL_SUBJECTS])
    verb = rng.choice(sorted(VERBS))
    third, _, objects = VERBS[verb]
    thing = rng.choice(objects)
    lowered = (
        subject
        if subject[0].isupper() and subject.split()[0] not in ("The", "Our", "My")
        else subject[0].lower() + subject[1:]
    )
    return {
        "instruction": "Turn the statement into a yes/no question.",
        "input": f"{subject} {third} {thing}.",
        "output": f"Does {lowered} {verb} {thing}?",
    }


def text_transform(rng: random.Random) -> Record:
    subject = rng.choice(SUBJECTS)
    verb = rng.choice(sorted(VERBS))
    third, _, objects = VERBS[verb]
    sentence = f"{subject} {verb if subject in PLURAL_SUBJECTS else third} {rng.choice(objects)}"
    kind = rng.randrange(4)
    if kind == 0:
        return {
            "instruction": "Convert the text to upper case.",
            "input": sentence,
            "output": sentence.upper(),
        }
    if kind == 1:
        words = sentence.split()
        return {
            "instruction": "How many words are in this sentence?",
            "input": sentence + ".",
            "output": f"The sentence has {NUMBER_WORDS[len(words)] if len(words) < len(NUMBER_WORDS) else len(words)} words.",
        }
    if kind == 2:
        words = rng.sample(sorted(PLURALS), 5)
        return {
            "instruction": "Sort these words in alphabetical order.",
            "input": ", ".join(words),
            "output": ", ".join(sorted(words)),
        }
    numbers = rng.sample(range(1, 100), 5)
    order = rng.choice(["smallest to largest", "largest to smallest"])
    ordered = sorted(numbers, reverse=order.startswith("largest"))
    return {
        "instruction": f"Sort the numbers from {order}.",
        "input": ", ".join(map(str, numbers)),
        "output": ", ".join(map(str, ordered)),
    }


def classify(rng: random.Random) -> Record:
    kind = rng.randrange(4)
    if kind == 0:
        animal = rng.choice(sorted(ANIMAL_CLASSES))
        group = ANIMAL_CLASSES[animal]
        article = "an" if group[0] in "aeiou" else "a"
        return {
            "instruction": "Classify the animal as a mammal, bird, fish, reptile or amphibian.",
            "input": animal,
            "output": f"The {animal} is {article} {group}.",
        }
    if kind == 1:
        number = rng.randint(1, 500)
        parity = "even" if number % 2 == 0 else "odd"
        return {
            "instruction": f"Is {number} an even or an odd number?",
            "input": "",
            "output": f"{number} is {parity}.",
        }
    if kind == 2:
        positive = rng.random() < 0.5
        thing = rng.choice(REVIEW_THINGS)
        word = rng.choice(POSITIVE_WORDS if positive else NEGATIVE_WORDS)
        ending = (
            rng.choice(["and I would recommend it.", "and I will come back."])
            if positive
            else rng.choice(["and I would not recommend it.", "and I will not come back."])
        )
        return {
            "instruction": "Is the sentiment of this review positive or negative?",
            "input": f"{thing} was {word} {ending}",
            "output": "Positive." if positive else "Negative.",
        }
    category, other = rng.sample(
        ["fruits", "vegetables", "colors", "sports", "musical instruments"], 2
    )
    item = rng.choice(CATEGORIES[category])
    return {
        "instruction": f'Is "{item}" one of the {category} or one of the {other}?',
        "input": "",
        "output": f'"{item[0].upper() + item[1:]}" is one of the {category}.',
    }


def facts(rng: random.Random) -> Record:
    if rng.random() < 0.5:
        country = rng.choice(sorted(CAPITALS))
        instruction = rng.choice(
            [f"What is the capital of {country}?", f"Name the capital city of {country}."]
        )
        return {
            "instruction": instruction,
            "input": "",
            "output": f"The capital of {country} is {CAPITALS[country]}.",
        }
    question, answer = rng.choice(SIMPLE_FACTS)
    return {"instruction": question, "input": "", "output": answer}


def compare_numbers(rng: random.Random) -> Record:
    a, b = rng.sample(range(1, 1000), 2)
    if rng.random() < 0.5:
        return {
            "instruction": "Which number is larger?",
            "input": f"{a} or {b}",
            "output": f"{max(a, b)} is larger than {min(a, b)}.",
        }
    return {
        "instruction": f"Which is smaller, {a} or {b}?",
        "input": "",
        "output": f"{min(a, b)} is smaller than {max(a, b)}.",
    }


DESCRIPTIONS = {
    "apple": "An apple is a round fruit that can be red, green or yellow.",
    "banana": "A banana is a long yellow fruit with a soft inside.",
    "lemon": "A lemon is a yellow fruit with a sour taste.",
    "piano": "A piano is a large instrument played by pressing black and white keys.",
    "guitar": "A guitar is an instrument with strings that you play with your fingers.",
    "drum": "A drum is an instrument that you hit to make a beat.",
    "kettle": "A kettle is a pot used to boil water.",
    "bicycle": "A bicycle is a vehicle with two wheels that you ride by pedalling.",
    "library": "A library is a place where you can borrow books.",
    "umbrella": "An umbrella keeps you dry when it rains.",
    "whale": "A whale is a very large mammal that lives in the sea.",
    "owl": "An owl is a bird that is awake at night.",
    "clock": "A clock is a device that shows the time.",
    "bridge": "A bridge lets people cross over a river or a road.",
}
SENTENCE_WORDS = {
    "hot": "The soup was too hot to eat.",
    "cold": "It was cold, so I wore a coat.",
    "fast": "The fast train reached the city in an hour.",
    "quiet": "The library was quiet all afternoon.",
    "heavy": "The box was too heavy to lift.",
    "early": "We left early to catch the bus.",
    "brave": "The brave firefighter saved the cat.",
    "empty": "The fridge was empty, so we went shopping.",
    "friend": "My friend helped me carry the bags.",
    "remember": "Please remember to lock the door.",
    "win": "Our team hopes to win the game.",
    "clean": "She keeps her room clean and tidy.",
}


def short_writing(rng: random.Random) -> Record:
    kind = rng.randrange(3)
    if kind == 0:
        thing = rng.choice(sorted(DESCRIPTIONS))
        instruction = rng.choice(
            [f"Describe a {thing} in one sentence.", f"What is a {thing}? Answer in one sentence."]
        )
        return {"instruction": instruction, "input": "", "output": DESCRIPTIONS[thing]}
    if kind == 1:
        word = rng.choice(sorted(SENTENCE_WORDS))
        return {
            "instruction": "Use the word in a short sentence.",
            "input": word,
            "output": SENTENCE_WORDS[word],
        }
    thing = rng.choice(REVIEW_THINGS)
    word = rng.choice(POSITIVE_WORDS)
    subject = thing.split(" ", 1)[1]
    return {
        "instruction": f"Write a one-sentence positive review of {subject}.",
        "input": "",
        "output": f"{thing} was {word}, and I would happily recommend it.",
    }


TASKS: list[tuple[Callable[[random.Random], Record], int]] = [
    (arithmetic, 16),
    (conversion, 10),
    (plural, 9),
    (antonym, 8),
    (synonym, 5),
    (list_items, 10),
    (past_tense, 9),
    (question_form, 5),
    (text_transform, 10),
    (classify, 12),
    (facts, 10),
    (compare_numbers, 5),
    (short_writing, 6),
]


def build(count: int, seed: int) -> list[Record]:
    """`count` distinct records (instruction and input unique), drawn from the weighted tasks."""
    rng = random.Random(seed)
    kinds = [task for task, _ in TASKS]
    weights = [weight for _, weight in TASKS]
    records: list[Record] = []
    seen: set[tuple[str, str]] = set()
    attempts = 0
    while len(records) < count:
        attempts += 1
        if attempts > count * 50:
            raise SystemExit(f"only {len(records)} distinct records could be drawn; ask for fewer")
        task = rng.choices(kinds, weights)[0]
        record = task(rng)
        key = (record["instruction"], record["input"])
        if key in seen:
            continue
        seen.add(key)
        records.append({"id": f"farmkit-demo-{len(records):04d}", **record, "task": task.__name__})
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--count", type=int, default=900)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "-o", "--output", type=Path, default=Path(__file__).parent / "data" / "instructions.jsonl"
    )
    args = parser.parse_args()
    records = build(args.count, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(f".{args.output.name}.partial")  # written whole or not at all
    with open(partial, "w") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(partial, args.output)


if __name__ == "__main__":
    main()
