"""The SQL agent's databases: six schemas, each filled with rows drawn from a seed.

A database is named ``<schema>-<seed>`` (``shops-3``); the same name always holds
the same rows. Files are written once under a folder of their own, atomically
(another process never sees half a file), made read-only, and reused.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any, Final

from spanmill import paths
from spanmill.tasks.base import TaskError

# Raise when the rows a seed gives change: databases are cached under this version.
DATA_VERSION: Final = "1"
DATABASES_PER_SCHEMA: Final = 8

Rows = list[tuple[Any, ...]]


@dataclass(frozen=True)
class Schema:
    """Tables (CREATE TABLE statements, in creation order) and how to fill them."""

    name: str
    tables: tuple[str, ...]
    fill: Callable[[random.Random], dict[str, Rows]]

    @property
    def ddl(self) -> str:
        return ";\n".join(self.tables) + ";"

    @property
    def table_names(self) -> list[str]:
        return [statement.split()[2] for statement in self.tables]


# -- shared vocabulary ------------------------------------------------------------------

FIRST_NAMES: Final = (
    "Ada", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas",
    "Kira", "Liam", "Maya", "Nils", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara",
    "Umar", "Vera", "Wim", "Xenia", "Yusuf", "Zoe", "Anton", "Bea", "Cyril", "Dana",
    "Emil", "Frida", "Goran", "Hana", "Ivo", "Julia", "Karl", "Lena", "Marco", "Nora",
)  # fmt: skip
LAST_NAMES: Final = (
    "Almeida", "Berg", "Costa", "Dahl", "Engel", "Fischer", "Garcia", "Horvat", "Ivanova",
    "Jensen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Olsen", "Petrov", "Quint",
    "Rossi", "Silva", "Torres", "Ueda", "Varga", "Weber", "Young", "Zielinski", "Brandt",
    "Carter", "Duarte", "Esposito", "Falk",
)  # fmt: skip
CITIES: Final = (
    "Lyon", "Porto", "Leeds", "Graz", "Turin", "Ghent", "Bergen", "Malmo", "Cork", "Bilbao",
    "Krakow", "Utrecht",
)  # fmt: skip
COUNTRIES: Final = (
    "Portugal", "Spain", "France", "Germany", "Italy", "Poland", "Norway", "Sweden",
    "Ireland", "Austria",
)  # fmt: skip


def people(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct full names."""
    pool = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
    return rng.sample(pool, n)


def day(rng: random.Random, first_year: int = 2022, years: int = 3) -> str:
    start = date(first_year, 1, 1)
    return (start + timedelta(days=rng.randrange(365 * years))).isoformat()


def later(iso_day: str, rng: random.Random, lo: int, hi: int) -> str:
    return (date.fromisoformat(iso_day) + timedelta(days=rng.randint(lo, hi))).isoformat()


def price(rng: random.Random, lo: float, hi: float) -> float:
    """A price in whole cents between lo and hi."""
    return rng.randint(round(lo * 100), round(hi * 100)) / 100


def weighted(rng: random.Random, choices: dict[str, int]) -> str:
    return rng.choices(list(choices), weights=list(choices.values()))[0]


# -- shops ------------------------------------------------------------------------------

CATALOGUE: Final[dict[str, tuple[tuple[float, float], tuple[str, ...]]]] = {
    "books": (
        (8, 40),
        ("Atlas of Rivers", "Garden Almanac", "Pocket Dictionary", "Night Sky Guide",
         "Bread Baking Basics", "Travel Journal"),
    ),
    "electronics": (
        (15, 300),
        ("Wireless Mouse", "USB-C Charger", "Bluetooth Speaker", "Noise-Cancelling Headphones",
         "Webcam", "E-Reader", "Smart Watch"),
    ),
    "kitchen": (
        (9, 120),
        ("Chef Knife", "Cast Iron Pan", "Coffee Grinder", "Tea Kettle", "Salad Bowl",
         "Pepper Mill"),
    ),
    "garden": (
        (5, 80),
        ("Hose Reel", "Pruning Shears", "Watering Can", "Bird Feeder", "Seed Starter Kit",
         "Garden Gloves"),
    ),
    "toys": (
        (6, 60),
        ("Puzzle Cube", "Wooden Train", "Kite", "Board Game", "Building Blocks", "Plush Bear"),
    ),
}  # fmt: skip


def fill_shops(rng: random.Random) -> dict[str, Rows]:
    cities = rng.sample(CITIES, 6)
    customers = [
        (i, name, rng.choice(cities), day(rng, 2020, 2))
        for i, name in enumerate(people(rng, 30), 1)
    ]
    offered = [(name, category) for category, (_, names) in CATALOGUE.items() for name in names]
    products = []
    for i, (name, category) in enumerate(rng.sample(offered, 24), 1):
        lo, hi = CATALOGUE[category][0]
        products.append((i, name, category, price(rng, lo, hi)))
    statuses = {"pending": 1, "shipped": 3, "delivered": 5, "cancelled": 1}
    orders = [
        (i, rng.randint(1, len(customers)), day(rng), weighted(rng, statuses)) for i in range(1, 91)
    ]
    items = [
        (order_id, product_id, rng.randint(1, 4))
        for order_id, *_ in orders
        for product_id in sorted(rng.sample(range(1, len(products) + 1), rng.randint(1, 3)))
    ]
    return {"customers": customers, "products": products, "orders": orders, "order_items": items}


SHOPS: Final = Schema(
    "shops",
    (
        "CREATE TABLE customers (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  city TEXT NOT NULL,\n"
        "  joined DATE NOT NULL\n"
        ")",
        "CREATE TABLE products (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  category TEXT NOT NULL,\n"
        "  price REAL NOT NULL\n"
        ")",
        "CREATE TABLE orders (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  customer_id INTEGER NOT NULL REFERENCES customers(id),\n"
        "  ordered_on DATE NOT NULL,\n"
        "  status TEXT NOT NULL\n"
        ")",
        "CREATE TABLE order_items (\n"
        "  order_id INTEGER NOT NULL REFERENCES orders(id),\n"
        "  product_id INTEGER NOT NULL REFERENCES products(id),\n"
        "  quantity INTEGER NOT NULL,\n"
        "  PRIMARY KEY (order_id, product_id)\n"
        ")",
    ),
    fill_shops,
)

# -- schools ----------------------------------------------------------------------------

COURSES: Final[dict[str, tuple[str, ...]]] = {
    "Mathematics": ("Algebra I", "Geometry", "Calculus", "Statistics"),
    "Physics": ("Mechanics", "Electricity and Magnetism", "Astronomy"),
    "Chemistry": ("General Chemistry", "Organic Chemistry", "Lab Techniques"),
    "Biology": ("Cell Biology", "Ecology", "Human Anatomy"),
    "History": ("World History", "Ancient Civilizations", "Modern Europe"),
    "English": ("Creative Writing", "Poetry", "World Literature"),
    "Art": ("Drawing", "Painting", "Sculpture"),
    "Music": ("Choir", "Music Theory", "Orchestra"),
    "Geography": ("Maps and Climate", "Urban Geography"),
}


def fill_schools(rng: random.Random) -> dict[str, Rows]:
    subjects = rng.sample(sorted(COURSES), 6)
    names = people(rng, 72)
    teachers: Rows = []
    courses: Rows = []
    for subject in subjects:
        titles = list(COURSES[subject])
        rng.shuffle(titles)
        for _ in range(rng.choice((1, 2, 2))):
            teacher_id = len(teachers) + 1
            teachers.append((teacher_id, names.pop(), subject, rng.randint(1995, 2023)))
            for _ in range(rng.choice((1, 1, 2))):
                if titles:
                    courses.append((len(courses) + 1, titles.pop(), teacher_id, rng.randint(1, 5)))
    students = [(i, names.pop(), rng.randint(9, 12)) for i in range(1, 61)]
    enrollments = [
        (student_id, course_id, rng.randint(35, 100))
        for student_id, *_ in students
        for course_id in sorted(rng.sample(range(1, len(courses) + 1), min(4, len(courses))))
    ]
    return {
        "teachers": teachers,
        "courses": courses,
        "students": students,
        "enrollments": enrollments,
    }


SCHOOLS: Final = Schema(
    "schools",
    (
        "CREATE TABLE teachers (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  subject TEXT NOT NULL,\n"
        "  hired_year INTEGER NOT NULL\n"
        ")",
        "CREATE TABLE courses (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  title TEXT NOT NULL,\n"
        "  teacher_id INTEGER NOT NULL REFERENCES teachers(id),\n"
        "  credits INTEGER NOT NULL\n"
        ")",
        "CREATE TABLE students (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  grade INTEGER NOT NULL\n"
        ")",
        "CREATE TABLE enrollments (\n"
        "  student_id INTEGER NOT NULL REFERENCES students(id),\n"
        "  course_id INTEGER NOT NULL REFERENCES courses(id),\n"
        "  score INTEGER NOT NULL,\n"
        "  PRIMARY KEY (student_id, course_id)\n"
        ")",
    ),
    fill_schools,
)

# -- flights ----------------------------------------------------------------------------

AIRPORTS: Final = (
    ("LIS", "Lisbon", "Portugal"), ("OPO", "Porto", "Portugal"), ("MAD", "Madrid", "Spain"),
    ("BCN", "Barcelona", "Spain"), ("CDG", "Paris", "France"), ("LYS", "Lyon", "France"),
    ("FRA", "Frankfurt", "Germany"), ("MUC", "Munich", "Germany"), ("AMS", "Amsterdam",
    "Netherlands"), ("CPH", "Copenhagen", "Denmark"), ("OSL", "Oslo", "Norway"),
    ("ARN", "Stockholm", "Sweden"), ("DUB", "Dublin", "Ireland"), ("VIE", "Vienna", "Austria"),
    ("FCO", "Rome", "Italy"), ("MXP", "Milan", "Italy"), ("ATH", "Athens", "Greece"),
    ("WAW", "Warsaw", "Poland"),
)  # fmt: skip
AIRLINES: Final = (
    ("SK", "Skyline Air"), ("NW", "Northwind Airways"), ("BB", "Bluebird Express"),
    ("AU", "Aurora Airlines"), ("MR", "Meridian Air"), ("CJ", "Coastal Jet"),
    ("SU", "Summit Airways"), ("PW", "Polar Wings"),
)  # fmt: skip
SEAT_PRICES: Final = {"economy": (40, 300), "business": (250, 900), "first": (700, 2000)}


def fill_flights(rng: random.Random) -> dict[str, Rows]:
    airports = sorted(rng.sample(AIRPORTS, 10))
    chosen = rng.sample(AIRLINES, 5)
    airlines = [(i, name, rng.choice(COUNTRIES)) for i, (_, name) in enumerate(chosen, 1)]
    flights: Rows = []
    numbers: set[str] = set()
    while len(flights) < 40:
        airline_id = rng.randint(1, len(chosen))
        number = f"{chosen[airline_id - 1][0]}{rng.randint(100, 999)}"
        origin, destination = rng.sample([code for code, *_ in airports], 2)
        if number in numbers:
            continue
        numbers.add(number)
        distance = rng.randint(300, 3200)
        minutes = distance * 60 // 780 + rng.randint(25, 45)
        flights.append(
            (len(flights) + 1, number, airline_id, origin, destination, distance, minutes)
        )
    passengers = people(rng, 70)
    bookings = []
    for i in range(1, 161):
        seat = weighted(rng, {"economy": 6, "business": 2, "first": 1})
        lo, hi = SEAT_PRICES[seat]
        bookings.append(
            (i, rng.randint(1, len(flights)), rng.choice(passengers), seat, price(rng, lo, hi))
        )
    return {"airports": airports, "airlines": airlines, "flights": flights, "bookings": bookings}


FLIGHTS: Final = Schema(
    "flights",
    (
        "CREATE TABLE airports (\n"
        "  code TEXT PRIMARY KEY,\n"
        "  city TEXT NOT NULL,\n"
        "  country TEXT NOT NULL\n"
        ")",
        "CREATE TABLE airlines (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  country TEXT NOT NULL\n"
        ")",
        "CREATE TABLE flights (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  flight_no TEXT NOT NULL UNIQUE,\n"
        "  airline_id INTEGER NOT NULL REFERENCES airlines(id),\n"
        "  origin TEXT NOT NULL REFERENCES airports(code),\n"
        "  destination TEXT NOT NULL REFERENCES airports(code),\n"
        "  distance_km INTEGER NOT NULL,\n"
        "  duration_min INTEGER NOT NULL\n"
        ")",
        "CREATE TABLE bookings (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  flight_id INTEGER NOT NULL REFERENCES flights(id),\n"
        "  passenger TEXT NOT NULL,\n"
        "  seat_class TEXT NOT NULL,\n"
        "  price REAL NOT NULL\n"
        ")",
    ),
    fill_flights,
)

# -- hotels -----------------------------------------------------------------------------

HOTEL_NAMES: Final = (
    "Grand Plaza", "Royal Crown", "Harbor View", "Park Lane", "Old Town Inn", "Riverside Lodge",
    "Central Station Hotel", "Garden Court", "Lakeside Retreat", "Hilltop House",
    "Seaside Suites", "Maple Residence", "Silver Birch", "Bridge Hotel", "Lantern House",
    "North Star",
)  # fmt: skip
ROOM_RATES: Final = {"single": (45, 120), "double": (70, 190), "suite": (150, 480)}


def fill_hotels(rng: random.Random) -> dict[str, Rows]:
    cities = rng.sample(CITIES, 5)
    hotels = [
        (i, name, rng.choice(cities), rng.randint(2, 5))
        for i, name in enumerate(rng.sample(HOTEL_NAMES, 12), 1)
    ]
    rooms: Rows = []
    for hotel_id, _, _, stars in hotels:
        for index in range(rng.randint(3, 16)):
            kind = weighted(rng, {"single": 3, "double": 4, "suite": 1})
            lo, hi = ROOM_RATES[kind]
            rate = price(rng, lo, hi) + 10 * (stars - 2)
            number = 100 * (1 + index // 4) + index % 4 + 1
            rooms.append((len(rooms) + 1, hotel_id, number, kind, round(rate, 2)))
    guests = [(i, name, rng.choice(COUNTRIES)) for i, name in enumerate(people(rng, 40), 1)]
    stays = [
        (i, rng.randint(1, len(guests)), rng.randint(1, len(rooms)), day(rng), rng.randint(1, 10))
        for i in range(1, 121)
    ]
    return {"hotels": hotels, "rooms": rooms, "guests": guests, "stays": stays}


HOTELS: Final = Schema(
    "hotels",
    (
        "CREATE TABLE hotels (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  city TEXT NOT NULL,\n"
        "  stars INTEGER NOT NULL\n"
        ")",
        "CREATE TABLE rooms (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  hotel_id INTEGER NOT NULL REFERENCES hotels(id),\n"
        "  room_number INTEGER NOT NULL,\n"
        "  kind TEXT NOT NULL,\n"
        "  nightly_rate REAL NOT NULL\n"
        ")",
        "CREATE TABLE guests (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  country TEXT NOT NULL\n"
        ")",
        "CREATE TABLE stays (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  guest_id INTEGER NOT NULL REFERENCES guests(id),\n"
        "  room_id INTEGER NOT NULL REFERENCES rooms(id),\n"
        "  check_in DATE NOT NULL,\n"
        "  nights INTEGER NOT NULL\n"
        ")",
    ),
    fill_hotels,
)

# -- clinics ----------------------------------------------------------------------------

CLINIC_NAMES: Final = (
    "Riverside Clinic", "Oakwood Health Center", "Harbor Medical", "Northgate Clinic",
    "Elm Street Practice", "Hillview Medical Center", "Meadow Clinic",
)  # fmt: skip
SPECIALTIES: Final = (
    "Cardiology", "Dermatology", "Pediatrics", "Neurology", "Orthopedics", "General Practice",
    "Ophthalmology",
)  # fmt: skip


def fill_clinics(rng: random.Random) -> dict[str, Rows]:
    clinics = [
        (i, name, rng.choice(CITIES[:6])) for i, name in enumerate(rng.sample(CLINIC_NAMES, 5), 1)
    ]
    names = people(rng, 76)
    specialties = rng.sample(SPECIALTIES, 5)
    doctors = [
        (i, names.pop(), rng.choice(specialties), rng.randint(1, len(clinics)))
        for i in range(1, 17)
    ]
    patients = [
        (i, names.pop(), rng.randint(1940, 2020), rng.choice(CITIES[:6])) for i in range(1, 61)
    ]
    appointments = [
        (
            i,
            rng.randint(1, len(patients)),
            rng.randint(1, len(doctors)),
            day(rng),
            float(rng.choice((40, 55, 60, 75, 90, 120, 150))),
        )
        for i in range(1, 161)
    ]
    return {
        "clinics": clinics,
        "doctors": doctors,
        "patients": patients,
        "appointments": appointments,
    }


CLINICS: Final = Schema(
    "clinics",
    (
        "CREATE TABLE clinics (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  city TEXT NOT NULL\n"
        ")",
        "CREATE TABLE doctors (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  specialty TEXT NOT NULL,\n"
        "  clinic_id INTEGER NOT NULL REFERENCES clinics(id)\n"
        ")",
        "CREATE TABLE patients (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  birth_year INTEGER NOT NULL,\n"
        "  city TEXT NOT NULL\n"
        ")",
        "CREATE TABLE appointments (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  patient_id INTEGER NOT NULL REFERENCES patients(id),\n"
        "  doctor_id INTEGER NOT NULL REFERENCES doctors(id),\n"
        "  day DATE NOT NULL,\n"
        "  fee REAL NOT NULL\n"
        ")",
    ),
    fill_clinics,
)

# -- libraries --------------------------------------------------------------------------

TITLE_WORDS: Final = (
    ("Silent", "Glass", "Hidden", "Last", "Winter", "Golden", "Broken", "Distant", "Paper",
     "Burning", "Quiet", "Northern"),
    ("River", "Garden", "Harbor", "Lighthouse", "Orchard", "Map", "Kingdom", "Letter", "Forest",
     "Mirror", "Island", "Bridge"),
)  # fmt: skip
GENRES: Final = (
    "Fantasy", "Mystery", "Science Fiction", "History", "Biography", "Poetry", "Travel",
)  # fmt: skip
BRANCHES: Final = ("Central", "Riverside", "Northside", "Old Town", "Harbor", "Westgate")


def fill_libraries(rng: random.Random) -> dict[str, Rows]:
    branches = [
        (i, name, rng.choice(CITIES[6:])) for i, name in enumerate(rng.sample(BRANCHES, 4), 1)
    ]
    titles = [f"The {a} {b}" for a in TITLE_WORDS[0] for b in TITLE_WORDS[1]]
    authors = people(rng, 12)
    books = [
        (i, title, rng.choice(authors), rng.choice(GENRES), rng.randint(1950, 2023))
        for i, title in enumerate(rng.sample(titles, 40), 1)
    ]
    members = [
        (i, name, rng.randint(1, len(branches)), day(rng, 2018, 5))
        for i, name in enumerate(people(rng, 45), 1)
    ]
    loans: Rows = []
    for i in range(1, 141):
        loaned = day(rng)
        returned = None if rng.random() < 0.2 else later(loaned, rng, 3, 40)
        loans.append(
            (i, rng.randint(1, len(books)), rng.randint(1, len(members)), loaned, returned)
        )
    return {"branches": branches, "books": books, "members": members, "loans": loans}


LIBRARIES: Final = Schema(
    "libraries",
    (
        "CREATE TABLE branches (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  city TEXT NOT NULL\n"
        ")",
        "CREATE TABLE books (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  title TEXT NOT NULL,\n"
        "  author TEXT NOT NULL,\n"
        "  genre TEXT NOT NULL,\n"
        "  published INTEGER NOT NULL\n"
        ")",
        "CREATE TABLE members (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  name TEXT NOT NULL,\n"
        "  branch_id INTEGER NOT NULL REFERENCES branches(id),\n"
        "  joined DATE NOT NULL\n"
        ")",
        "CREATE TABLE loans (\n"
        "  id INTEGER PRIMARY KEY,\n"
        "  book_id INTEGER NOT NULL REFERENCES books(id),\n"
        "  member_id INTEGER NOT NULL REFERENCES members(id),\n"
        "  loaned_on DATE NOT NULL,\n"
        "  returned_on DATE\n"
        ")",
    ),
    fill_libraries,
)

SCHEMAS: Final[dict[str, Schema]] = {
    schema.name: schema for schema in (SHOPS, SCHOOLS, FLIGHTS, HOTELS, CLINICS, LIBRARIES)
}


def database_name(schema: str, seed: int) -> str:
    return f"{schema}-{seed}"


def write_database(path: Path, schema: Schema, seed: int) -> None:
    """Create the database ``schema``-``seed`` at ``path`` (which must not exist)."""
    tables = schema.fill(random.Random(f"sql:{schema.name}:{seed}"))
    conn = sqlite3.connect(path)
    try:
        with conn:
            for statement, name in zip(schema.tables, schema.table_names, strict=True):
                conn.execute(statement)
                rows = tables[name]
                if rows:
                    marks = ", ".join("?" * len(rows[0]))
                    conn.executemany(f"INSERT INTO {name} VALUES ({marks})", rows)
    finally:
        conn.close()


class DatabaseStore:
    """The database files, built on first use under ``root`` and reused after."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or paths.home() / "tasks" / "sql") / f"v{DATA_VERSION}"

    def path(self, schema: str, seed: int) -> Path:
        if schema not in SCHEMAS:
            raise TaskError(f"no SQL schema {schema!r}; there are {', '.join(SCHEMAS)}")
        if not 0 <= seed < DATABASES_PER_SCHEMA:
            raise TaskError(f"database seeds run from 0 to {DATABASES_PER_SCHEMA - 1}, got {seed}")
        path = self.root / f"{database_name(schema, seed)}.sqlite"
        if not path.is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            partial.unlink(missing_ok=True)
            write_database(partial, SCHEMAS[schema], seed)
            partial.chmod(0o444)
            os.replace(partial, path)
        return path
