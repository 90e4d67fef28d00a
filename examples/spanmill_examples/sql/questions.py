"""Question templates of the SQL agent, each with its gold query, per schema.

A template's placeholders are filled from the database it is asked about (a city
that is in it, a customer who exists), then the gold query is run: a question is
kept only when its answer says something (rows, not too many, not a bare zero)
and, when it asks for an order, when that order is unambiguous (no ties among the
rows, nor at the LIMIT's edge).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

from spanmill_examples.sql.execute import QueryResult, run_query, same_value

# Answers longer than this many rows are not asked for: the agent sees them all.
MAX_ANSWER_ROWS: Final = 12
_ORDER_BY: Final = re.compile(r"\bORDER\s+BY\b", re.IGNORECASE)

Value = str | int


@dataclass(frozen=True)
class Pick:
    """Values taken from one row of a query on the database; the columns name them."""

    sql: str

    def draw(self, rng: random.Random, database: Path) -> dict[str, Value]:
        columns, rows = _values(database, self.sql)
        return dict(zip(columns, rng.choice(rows), strict=True))


@dataclass(frozen=True)
class Choice:
    """One of a few fixed values."""

    name: str
    values: tuple[Value, ...]

    def draw(self, rng: random.Random, database: Path) -> dict[str, Value]:
        return {self.name: rng.choice(self.values)}


@lru_cache(maxsize=512)
def _values(database: Path, sql: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    result = run_query(database, sql)
    if not result.rows:
        raise ValueError(f"{sql!r} finds no values in {database.name}")
    return result.columns, sorted(result.rows, key=repr)


def literal(value: Value) -> str:
    """A value as an SQL literal."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


@dataclass(frozen=True)
class Template:
    """A question, its gold SQL, and where its placeholders' values come from.

    ``order_key`` is the result column an ordered question sorts by, and ``k``
    the placeholder of its LIMIT; both are used only to refuse ambiguous orders.
    """

    id: str
    text: str
    sql: str
    params: tuple[Pick | Choice, ...] = ()
    order_key: int | None = None
    limit: str | None = None

    @property
    def ordered(self) -> bool:
        return bool(_ORDER_BY.search(self.sql))

    def question(self, values: Mapping[str, Value]) -> str:
        return self.text.format(**{name: str(value) for name, value in values.items()})

    def gold(self, values: Mapping[str, Value]) -> str:
        return self.sql.format(**{name: literal(value) for name, value in values.items()})

    def draw(self, rng: random.Random, database: Path) -> dict[str, Value]:
        values: dict[str, Value] = {}
        for param in self.params:
            values.update(param.draw(rng, database))
        return values

    def acceptable(self, database: Path, values: Mapping[str, Value], result: QueryResult) -> bool:
        rows = result.rows
        if not rows or len(rows) > MAX_ANSWER_ROWS:
            return False
        if any(all(value is None for value in row) for row in rows):
            return False
        if len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] in (0, None):
            return False
        if self.order_key is None:
            return True
        keys = [row[self.order_key] for row in rows]
        if any(same_value(a, b) for i, a in enumerate(keys) for b in keys[i + 1 :]):
            return False
        if self.limit is None:
            return True
        more = {**values, self.limit: int(values[self.limit]) + 1}
        extended = run_query(database, self.gold(more)).rows
        return len(extended) <= len(rows) or not same_value(
            extended[len(rows)][self.order_key], keys[-1]
        )


def _top(k: tuple[int, ...] = (2, 3, 4)) -> Choice:
    return Choice("k", k)


SHOPS: Final = (
    Template(
        "customers-in-city",
        "How many customers live in {city}?",
        "SELECT COUNT(*) FROM customers WHERE city = {city}",
        (Pick("SELECT DISTINCT city FROM customers"),),
    ),
    Template(
        "cheap-products-in-category",
        "Which products in the {category} category cost less than {price} dollars? "
        "Give their names.",
        "SELECT name FROM products WHERE category = {category} AND price < {price}",
        (Pick("SELECT DISTINCT category FROM products"), Choice("price", (20, 30, 50, 100))),
    ),
    Template(
        "average-price-in-category",
        "What is the average price of the products in the {category} category?",
        "SELECT AVG(price) FROM products WHERE category = {category}",
        (Pick("SELECT DISTINCT category FROM products"),),
    ),
    Template(
        "orders-of-customer",
        "How many orders has {customer} placed?",
        "SELECT COUNT(*) FROM orders JOIN customers ON customers.id = orders.customer_id "
        "WHERE customers.name = {customer}",
        (Pick("SELECT name AS customer FROM customers"),),
    ),
    Template(
        "customers-per-city",
        "How many customers live in each city? Give each city and its number of customers.",
        "SELECT city, COUNT(*) FROM customers GROUP BY city",
    ),
    Template(
        "most-expensive-products",
        "What are the {k} most expensive products? Give their names and prices, the most "
        "expensive first.",
        "SELECT name, price FROM products ORDER BY price DESC LIMIT {k}",
        (_top((3, 4, 5)),),
        order_key=1,
        limit="k",
    ),
    Template(
        "units-of-product",
        "How many units of {product} have been ordered in total?",
        "SELECT SUM(order_items.quantity) FROM order_items JOIN products ON products.id = "
        "order_items.product_id WHERE products.name = {product}",
        (Pick("SELECT name AS product FROM products"),),
    ),
    Template(
        "customers-buying-category",
        "How many different customers have ordered a product in the {category} category?",
        "SELECT COUNT(DISTINCT orders.customer_id) FROM orders JOIN order_items ON "
        "order_items.order_id = orders.id JOIN products ON products.id = order_items.product_id "
        "WHERE products.category = {category}",
        (Pick("SELECT DISTINCT category FROM products"),),
    ),
    Template(
        "top-customers-by-orders",
        "Which {k} customers have placed the most orders? Give their names and numbers of "
        "orders, the most orders first.",
        "SELECT customers.name, COUNT(*) FROM orders JOIN customers ON customers.id = "
        "orders.customer_id GROUP BY customers.id ORDER BY COUNT(*) DESC LIMIT {k}",
        (_top((2, 3)),),
        order_key=1,
        limit="k",
    ),
    Template(
        "orders-with-status-in-year",
        "How many orders with the status '{status}' were placed in {year}?",
        "SELECT COUNT(*) FROM orders WHERE status = {status} AND strftime('%Y', ordered_on) "
        "= {year}",
        (Pick("SELECT DISTINCT status FROM orders"), Choice("year", ("2022", "2023", "2024"))),
    ),
)

SCHOOLS: Final = (
    Template(
        "students-in-grade",
        "How many students are in grade {grade}?",
        "SELECT COUNT(*) FROM students WHERE grade = {grade}",
        (Pick("SELECT DISTINCT grade FROM students"),),
    ),
    Template(
        "teachers-of-subject",
        "Which teachers teach {subject}? Give their names.",
        "SELECT name FROM teachers WHERE subject = {subject}",
        (Pick("SELECT DISTINCT subject FROM teachers"),),
    ),
    Template(
        "average-score-in-course",
        "What is the average score in the course {course}?",
        "SELECT AVG(enrollments.score) FROM enrollments JOIN courses ON courses.id = "
        "enrollments.course_id WHERE courses.title = {course}",
        (Pick("SELECT title AS course FROM courses"),),
    ),
    Template(
        "courses-of-teacher",
        "Which courses does {teacher} teach? Give their titles.",
        "SELECT courses.title FROM courses JOIN teachers ON teachers.id = courses.teacher_id "
        "WHERE teachers.name = {teacher}",
        (Pick("SELECT name AS teacher FROM teachers"),),
    ),
    Template(
        "teachers-per-subject",
        "How many teachers teach each subject? Give each subject and its number of teachers.",
        "SELECT subject, COUNT(*) FROM teachers GROUP BY subject",
    ),
    Template(
        "top-students-by-average",
        "Which {k} students have the highest average score? Give their names and average "
        "scores, the highest first.",
        "SELECT students.name, AVG(enrollments.score) FROM enrollments JOIN students ON "
        "students.id = enrollments.student_id GROUP BY students.id ORDER BY "
        "AVG(enrollments.score) DESC LIMIT {k}",
        (_top(),),
        order_key=1,
        limit="k",
    ),
    Template(
        "students-of-teacher",
        "How many different students take a course taught by {teacher}?",
        "SELECT COUNT(DISTINCT enrollments.student_id) FROM enrollments JOIN courses ON "
        "courses.id = enrollments.course_id JOIN teachers ON teachers.id = courses.teacher_id "
        "WHERE teachers.name = {teacher}",
        (Pick("SELECT name AS teacher FROM teachers"),),
    ),
    Template(
        "best-score-in-subject",
        "What is the highest score any student got in a {subject} course?",
        "SELECT MAX(enrollments.score) FROM enrollments JOIN courses ON courses.id = "
        "enrollments.course_id JOIN teachers ON teachers.id = courses.teacher_id WHERE "
        "teachers.subject = {subject}",
        (Pick("SELECT DISTINCT subject FROM teachers"),),
    ),
    Template(
        "large-courses",
        "Which courses have more than {n} students enrolled? Give their titles.",
        "SELECT courses.title FROM courses JOIN enrollments ON enrollments.course_id = "
        "courses.id GROUP BY courses.id HAVING COUNT(*) > {n}",
        (Choice("n", (15, 20, 25, 30)),),
    ),
    Template(
        "credits-of-student",
        "What is the total number of credits of the courses {student} takes?",
        "SELECT SUM(courses.credits) FROM courses JOIN enrollments ON enrollments.course_id = "
        "courses.id JOIN students ON students.id = enrollments.student_id WHERE students.name "
        "= {student}",
        (Pick("SELECT name AS student FROM students"),),
    ),
)

_FLIGHT_CITIES: Final = (
    "FROM flights JOIN airports AS o ON o.code = flights.origin JOIN airports AS d ON "
    "d.code = flights.destination"
)

FLIGHTS: Final = (
    Template(
        "departures-from-city",
        "How many flights depart from {city}?",
        "SELECT COUNT(*) FROM flights JOIN airports ON airports.code = flights.origin WHERE "
        "airports.city = {city}",
        (Pick("SELECT city FROM airports"),),
    ),
    Template(
        "airports-in-country",
        "Which airports are in {country}? Give their codes.",
        "SELECT code FROM airports WHERE country = {country}",
        (Pick("SELECT DISTINCT country FROM airports"),),
    ),
    Template(
        "average-price-of-class",
        "What is the average price of a booking in {seat_class} class?",
        "SELECT AVG(price) FROM bookings WHERE seat_class = {seat_class}",
        (Pick("SELECT DISTINCT seat_class FROM bookings"),),
    ),
    Template(
        "flights-of-airline",
        "How many flights does {airline} operate?",
        "SELECT COUNT(*) FROM flights JOIN airlines ON airlines.id = flights.airline_id WHERE "
        "airlines.name = {airline}",
        (Pick("SELECT name AS airline FROM airlines"),),
    ),
    Template(
        "flights-per-airline",
        "How many flights does each airline operate? Give each airline's name and its number "
        "of flights.",
        "SELECT airlines.name, COUNT(*) FROM flights JOIN airlines ON airlines.id = "
        "flights.airline_id GROUP BY airlines.id",
    ),
    Template(
        "longest-flights",
        "What are the {k} longest flights? Give their flight numbers and distances in km, the "
        "longest first.",
        "SELECT flight_no, distance_km FROM flights ORDER BY distance_km DESC LIMIT {k}",
        (_top((3, 4, 5)),),
        order_key=1,
        limit="k",
    ),
    Template(
        "bookings-value-of-flight",
        "What is the total price of all bookings on flight {flight_no}?",
        "SELECT SUM(bookings.price) FROM bookings JOIN flights ON flights.id = "
        "bookings.flight_id WHERE flights.flight_no = {flight_no}",
        (Pick("SELECT flight_no FROM flights"),),
    ),
    Template(
        "passengers-of-airline",
        "How many different passengers have booked a flight with {airline}?",
        "SELECT COUNT(DISTINCT bookings.passenger) FROM bookings JOIN flights ON flights.id = "
        "bookings.flight_id JOIN airlines ON airlines.id = flights.airline_id WHERE "
        "airlines.name = {airline}",
        (Pick("SELECT name AS airline FROM airlines"),),
    ),
    Template(
        "flights-between-cities",
        "Which flights go from {origin} to {destination}? Give their flight numbers.",
        f"SELECT flights.flight_no {_FLIGHT_CITIES} WHERE o.city = {{origin}} AND d.city = "
        "{destination}",
        (Pick(f"SELECT DISTINCT o.city AS origin, d.city AS destination {_FLIGHT_CITIES}"),),
    ),
    Template(
        "short-flights",
        "How many flights are shorter than {km} km?",
        "SELECT COUNT(*) FROM flights WHERE distance_km < {km}",
        (Choice("km", (800, 1000, 1500, 2000)),),
    ),
)

_ROOMS_OF_HOTELS: Final = "FROM rooms JOIN hotels ON hotels.id = rooms.hotel_id"

HOTELS: Final = (
    Template(
        "starred-hotels-in-city",
        "How many hotels in {city} have at least {stars} stars?",
        "SELECT COUNT(*) FROM hotels WHERE city = {city} AND stars >= {stars}",
        (Pick("SELECT DISTINCT city FROM hotels"), Choice("stars", (3, 4))),
    ),
    Template(
        "hotels-with-stars",
        "Which hotels have {stars} stars? Give their names.",
        "SELECT name FROM hotels WHERE stars = {stars}",
        (Pick("SELECT DISTINCT stars FROM hotels"),),
    ),
    Template(
        "average-rate-at-hotel",
        "What is the average nightly rate of the {kind} rooms at {hotel}?",
        f"SELECT AVG(rooms.nightly_rate) {_ROOMS_OF_HOTELS} WHERE hotels.name = {{hotel}} AND "
        "rooms.kind = {kind}",
        (Pick(f"SELECT DISTINCT hotels.name AS hotel, rooms.kind AS kind {_ROOMS_OF_HOTELS}"),),
    ),
    Template(
        "nights-of-guest",
        "How many nights has {guest} stayed in total?",
        "SELECT SUM(stays.nights) FROM stays JOIN guests ON guests.id = stays.guest_id WHERE "
        "guests.name = {guest}",
        (Pick("SELECT name AS guest FROM guests"),),
    ),
    Template(
        "hotels-per-city",
        "How many hotels are there in each city? Give each city and its number of hotels.",
        "SELECT city, COUNT(*) FROM hotels GROUP BY city",
    ),
    Template(
        "hotels-with-most-rooms",
        "Which {k} hotels have the most rooms? Give their names and numbers of rooms, the most "
        "rooms first.",
        f"SELECT hotels.name, COUNT(*) {_ROOMS_OF_HOTELS} GROUP BY hotels.id ORDER BY COUNT(*) "
        "DESC LIMIT {k}",
        (_top((2, 3)),),
        order_key=1,
        limit="k",
    ),
    Template(
        "cheapest-room-in-city",
        "What is the lowest nightly rate of a {kind} room in {city}?",
        f"SELECT MIN(rooms.nightly_rate) {_ROOMS_OF_HOTELS} WHERE hotels.city = {{city}} AND "
        "rooms.kind = {kind}",
        (Pick(f"SELECT DISTINCT hotels.city AS city, rooms.kind AS kind {_ROOMS_OF_HOTELS}"),),
    ),
    Template(
        "guests-from-country-in-city",
        "How many different guests from {country} have stayed at a hotel in {city}?",
        "SELECT COUNT(DISTINCT stays.guest_id) FROM stays JOIN guests ON guests.id = "
        "stays.guest_id JOIN rooms ON rooms.id = stays.room_id JOIN hotels ON hotels.id = "
        "rooms.hotel_id WHERE guests.country = {country} AND hotels.city = {city}",
        (
            Pick(
                "SELECT DISTINCT guests.country AS country, hotels.city AS city FROM stays JOIN "
                "guests ON guests.id = stays.guest_id JOIN rooms ON rooms.id = stays.room_id "
                "JOIN hotels ON hotels.id = rooms.hotel_id"
            ),
        ),
    ),
    Template(
        "nights-in-city",
        "How many nights in total have been booked at hotels in {city}?",
        "SELECT SUM(stays.nights) FROM stays JOIN rooms ON rooms.id = stays.room_id JOIN hotels "
        "ON hotels.id = rooms.hotel_id WHERE hotels.city = {city}",
        (Pick("SELECT DISTINCT city FROM hotels"),),
    ),
    Template(
        "long-stays",
        "How many stays lasted more than {n} nights?",
        "SELECT COUNT(*) FROM stays WHERE nights > {n}",
        (Choice("n", (3, 5, 7)),),
    ),
)

CLINICS: Final = (
    Template(
        "patients-born-before",
        "How many patients were born before {year}?",
        "SELECT COUNT(*) FROM patients WHERE birth_year < {year}",
        (Choice("year", (1960, 1970, 1980, 1990, 2000)),),
    ),
    Template(
        "doctors-of-specialty",
        "Which doctors work in {specialty}? Give their names.",
        "SELECT name FROM doctors WHERE specialty = {specialty}",
        (Pick("SELECT DISTINCT specialty FROM doctors"),),
    ),
    Template(
        "average-fee-of-doctor",
        "What is the average fee of the appointments with {doctor}?",
        "SELECT AVG(appointments.fee) FROM appointments JOIN doctors ON doctors.id = "
        "appointments.doctor_id WHERE doctors.name = {doctor}",
        (Pick("SELECT name AS doctor FROM doctors"),),
    ),
    Template(
        "appointments-of-patient",
        "How many appointments has {patient} had?",
        "SELECT COUNT(*) FROM appointments JOIN patients ON patients.id = "
        "appointments.patient_id WHERE patients.name = {patient}",
        (Pick("SELECT name AS patient FROM patients"),),
    ),
    Template(
        "doctors-per-specialty",
        "How many doctors are there in each specialty? Give each specialty and its number of "
        "doctors.",
        "SELECT specialty, COUNT(*) FROM doctors GROUP BY specialty",
    ),
    Template(
        "busiest-doctors",
        "Which {k} doctors have had the most appointments? Give their names and numbers of "
        "appointments, the most first.",
        "SELECT doctors.name, COUNT(*) FROM appointments JOIN doctors ON doctors.id = "
        "appointments.doctor_id GROUP BY doctors.id ORDER BY COUNT(*) DESC LIMIT {k}",
        (_top((2, 3)),),
        order_key=1,
        limit="k",
    ),
    Template(
        "fees-at-clinic",
        "What is the total of the fees of all appointments at {clinic}?",
        "SELECT SUM(appointments.fee) FROM appointments JOIN doctors ON doctors.id = "
        "appointments.doctor_id JOIN clinics ON clinics.id = doctors.clinic_id WHERE "
        "clinics.name = {clinic}",
        (Pick("SELECT name AS clinic FROM clinics"),),
    ),
    Template(
        "patients-of-specialty",
        "How many different patients have seen a doctor in {specialty}?",
        "SELECT COUNT(DISTINCT appointments.patient_id) FROM appointments JOIN doctors ON "
        "doctors.id = appointments.doctor_id WHERE doctors.specialty = {specialty}",
        (Pick("SELECT DISTINCT specialty FROM doctors"),),
    ),
    Template(
        "doctors-in-city",
        "How many doctors work at clinics in {city}?",
        "SELECT COUNT(*) FROM doctors JOIN clinics ON clinics.id = doctors.clinic_id WHERE "
        "clinics.city = {city}",
        (Pick("SELECT DISTINCT city FROM clinics"),),
    ),
    Template(
        "appointments-in-year",
        "How many appointments took place in {year}?",
        "SELECT COUNT(*) FROM appointments WHERE strftime('%Y', day) = {year}",
        (Choice("year", ("2022", "2023", "2024")),),
    ),
)

LIBRARIES: Final = (
    Template(
        "genre-books-after-year",
        "How many {genre} books were published after {year}?",
        "SELECT COUNT(*) FROM books WHERE genre = {genre} AND published > {year}",
        (Pick("SELECT DISTINCT genre FROM books"), Choice("year", (1970, 1980, 1990, 2000))),
    ),
    Template(
        "books-by-author",
        "Which books did {author} write? Give their titles.",
        "SELECT title FROM books WHERE author = {author}",
        (Pick("SELECT DISTINCT author FROM books"),),
    ),
    Template(
        "average-year-of-genre",
        "What is the average publication year of the {genre} books?",
        "SELECT AVG(published) FROM books WHERE genre = {genre}",
        (Pick("SELECT DISTINCT genre FROM books"),),
    ),
    Template(
        "loans-of-member",
        "How many loans has {member} made?",
        "SELECT COUNT(*) FROM loans JOIN members ON members.id = loans.member_id WHERE "
        "members.name = {member}",
        (Pick("SELECT name AS member FROM members"),),
    ),
    Template(
        "books-per-genre",
        "How many books are there in each genre? Give each genre and its number of books.",
        "SELECT genre, COUNT(*) FROM books GROUP BY genre",
    ),
    Template(
        "most-borrowed-books",
        "Which {k} books have been borrowed most often? Give their titles and numbers of loans, "
        "the most borrowed first.",
        "SELECT books.title, COUNT(*) FROM loans JOIN books ON books.id = loans.book_id GROUP "
        "BY books.id ORDER BY COUNT(*) DESC LIMIT {k}",
        (_top((2, 3)),),
        order_key=1,
        limit="k",
    ),
    Template(
        "members-of-branch",
        "How many members does the {branch} branch have?",
        "SELECT COUNT(*) FROM members JOIN branches ON branches.id = members.branch_id WHERE "
        "branches.name = {branch}",
        (Pick("SELECT name AS branch FROM branches"),),
    ),
    Template(
        "borrowers-of-author",
        "How many different members have borrowed a book by {author}?",
        "SELECT COUNT(DISTINCT loans.member_id) FROM loans JOIN books ON books.id = "
        "loans.book_id WHERE books.author = {author}",
        (Pick("SELECT DISTINCT author FROM books"),),
    ),
    Template(
        "unreturned-at-branch",
        "How many loans by members of the {branch} branch have not been returned yet?",
        "SELECT COUNT(*) FROM loans JOIN members ON members.id = loans.member_id JOIN branches "
        "ON branches.id = members.branch_id WHERE loans.returned_on IS NULL AND branches.name "
        "= {branch}",
        (Pick("SELECT name AS branch FROM branches"),),
    ),
    Template(
        "oldest-books",
        "What are the {k} oldest books? Give their titles and publication years, the oldest first.",
        "SELECT title, published FROM books ORDER BY published ASC LIMIT {k}",
        (_top((2, 3, 4)),),
        order_key=1,
        limit="k",
    ),
)

TEMPLATES: Final[dict[str, tuple[Template, ...]]] = {
    "shops": SHOPS,
    "schools": SCHOOLS,
    "flights": FLIGHTS,
    "hotels": HOTELS,
    "clinics": CLINICS,
    "libraries": LIBRARIES,
}
