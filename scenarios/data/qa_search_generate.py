"""Write the `qa_search` data: a corpus of short passages about invented places and people, and
two-hop questions whose answer needs two of them (the first names a person, the second tells
the fact about that person).

Everything is drawn from `random.Random("qa_search:0")` out of the word lists below, so the
files are reproducible byte for byte (tests/environments/test_qa_search.py checks the shipped
copies) and the facts exist nowhere else: a model cannot answer from memory.

    uv run python scenarios/data/qa_search_generate.py
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).parent
N_QUESTIONS = 240
N_DISTRACTORS = 120

FIRST = (
    "Lina", "Tomas", "Mira", "Anselm", "Petra", "Oskar", "Ilse", "Ruben", "Sanne", "Dario",
    "Elif", "Jonas", "Maren", "Teodor", "Ada", "Bram", "Cora", "Emil", "Freya", "Gideon", "Hana",
    "Ivo", "Janne", "Kasper", "Lotte", "Milo", "Nadia", "Otto", "Runa", "Selim", "Tilda", "Vera",
    "Wim", "Yara", "Zeno", "Agnes", "Bastian", "Clara", "Dmitri", "Edda",
)  # fmt: skip
SURNAME_PARTS = (
    ("Okor", "Vand", "Quell", "Marr", "Thess", "Brun", "Kaal", "Dorv", "Fenn", "Hald", "Ister",
     "Lomb", "Narv", "Oster", "Pell", "Rask", "Sorr", "Tarn", "Ulv", "Wend"),
    ("o", "el", "in", "ow", "ant", "ick", "ard", "ess", "um", "ay"),
)  # fmt: skip
PLACE_PARTS = (
    ("", "Upper ", "Lower ", "Old "),
    ("Ash", "Bram", "Cold", "Dun", "Elm", "Fair", "Glen", "High", "Ivy", "Kings", "Lark", "Mill",
     "North", "Oak", "Raven", "Salt", "Thorn", "Wester", "Whit", "Yew"),
    ("ford", "wick", "haven", "mere", "stead", "bury", "moor", "dale", "field", "port"),
)  # fmt: skip
RIVERS = (
    "Sarn", "Ysel", "Dorn", "Calla", "Mervin", "Oust", "Tessa", "Wyre", "Brant", "Lune", "Arro",
    "Kell", "Vista", "Orme", "Pyle", "Renne", "Soll", "Tave", "Umber", "Vey",
)  # fmt: skip
INSTRUMENTS = ("cello", "oboe", "harp", "viola", "clarinet", "bassoon", "lute", "trumpet")
UNIVERSITIES = ("Alder", "Corve", "Halden", "Mistral", "Orrin", "Pemberly", "Sable", "Wick")
JOBS = ("engineer", "architect", "surveyor", "builder")
LANDMARKS = ("Bridge", "Tower", "Viaduct", "Lighthouse", "Dam", "Aqueduct")
GROUPS = ("Ensemble", "Quartet", "Choir", "Consort")
FIRMS = ("Works", "Company", "Foundry", "Mills")


def names(parts: tuple[tuple[str, ...], ...], sep: str = "") -> list[str]:
    return [sep.join(p) for p in itertools.product(*parts)]


def world(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(passages, questions): each question gets its own person and a fresh first-hop entity;
    further people share surnames, towns and trades, so a careless search finds them too."""
    surnames, places = names(SURNAME_PARTS), names(PLACE_PARTS)
    people = [f"{f} {s}" for f in FIRST for s in surnames]
    rng.shuffle(people)
    rng.shuffle(places)
    people_iter, places_iter = iter(people), iter(places)

    def place_unlike(other: str) -> str:
        """A fresh place whose last word differs from `other`'s ("Old Millbury" gives away
        "Millbury")."""
        return next(p for p in places_iter if p.split()[-1] != other.split()[-1])

    passages: list[dict] = []
    questions: list[dict] = []

    def add(title: str, text: str) -> str:
        pid = f"p{len(passages):04d}"
        passages.append({"id": pid, "title": title, "text": text})
        return pid

    def person_passage(person: str) -> tuple[str, dict[str, str]]:
        facts = {
            "town": next(places_iter),
            "year": str(rng.randint(1890, 1985)),
            "instrument": rng.choice(INSTRUMENTS),
            "university": f"{rng.choice(UNIVERSITIES)} University",
            "job": rng.choice(JOBS),
        }
        moved = rng.choice(places)
        article = "an" if facts["job"][0] in "aeiou" else "a"
        text = (
            f"{person} was born in {facts['town']} in {facts['year']} and later moved to "
            f"{moved}. {person.split()[0]} studied at {facts['university']}, worked as "
            f"{article} {facts['job']} and played the {facts['instrument']} in spare hours."
        )
        return add(person, text), facts

    kinds = ("town", "year", "instrument", "university", "river")
    for i in range(N_QUESTIONS):
        kind = kinds[i % len(kinds)]
        if kind == "river":  # province -> capital city -> river (the capital is the bridge)
            province = next(places_iter)
            city, river = place_unlike(province), rng.choice(RIVERS)
            first = add(
                f"{province} Province",
                f"{province} Province is a hill region of farms and quarries whose capital is "
                f"the city of {city}.",
            )
            second = add(
                city,
                f"{city} is built on both banks of the {river}, a slow river that floods "
                "every spring.",
            )
            question = f"Which river flows through the capital of {province} Province?"
            answers = [river, f"the {river}", f"{river} river"]
        else:
            person = next(people_iter)
            second, facts = person_passage(person)
            place = place_unlike(facts["town"])
            if kind == "town":
                entity = f"{place} {rng.choice(LANDMARKS)}"
                first = add(
                    entity,
                    f"The {entity} was designed by {person} and opened in "
                    f"{rng.randint(1900, 2010)}.",
                )
                question = f"In which town was the designer of the {entity} born?"
            elif kind == "instrument":
                entity = f"{place} {rng.choice(GROUPS)}"
                first = add(
                    entity,
                    f"The {entity} was founded in {rng.randint(1920, 2010)} by {person}, who "
                    "led it for many years.",
                )
                question = f"Which instrument did the founder of the {entity} play?"
            elif kind == "university":
                entity = f"{place} {rng.choice(FIRMS)}"
                first = add(
                    entity,
                    f"{entity} makes tools and rope; it was started by {person} in a rented shed.",
                )
                question = f"At which university did the founder of {entity} study?"
            else:
                entity = f"{place} Hall"
                first = add(
                    entity,
                    f"{entity} is a concert hall whose plans were drawn by {person}.",
                )
                question = f"In which year was the architect of {entity} born?"
            answer = facts[kind]
            answers = [answer]
            if kind == "instrument":
                answers.append(f"the {answer}")
            if kind == "university":
                answers.append(answer.removesuffix(" University"))
        questions.append(
            {"id": f"qs-{i:03d}", "question": question, "answers": answers,
             "support": [first, second]}
        )  # fmt: skip
    for _ in range(N_DISTRACTORS):
        person_passage(next(people_iter))
    order = list(range(len(passages)))
    rng.shuffle(order)  # ids stay, file order does not follow the questions
    return [passages[i] for i in order], questions


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def main() -> None:
    passages, questions = world(random.Random("qa_search:0"))
    write(HERE / "qa_search_corpus.jsonl", passages)
    write(HERE / "qa_search.jsonl", questions)


if __name__ == "__main__":
    main()
