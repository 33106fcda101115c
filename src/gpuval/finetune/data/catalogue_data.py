"""A data table: the catalogue's value pools (POOLS) and function specs (CATALOGUE), nothing else.

Declared a data table for tests/test_structure.py, which lets it run past the line limit of a module: it
is one long literal, read row by row, not logic. How pools are drawn from and split into train, holdout
and synthetic parts is catalogue.py's. The records synthesised from this table (and the bundled tiny
model trained on them) depend on every value and its order: change it only with that in mind.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from typing import Any

from gpuval.finetune.data.catalogue_types import FunctionSpec, Param, Pool


def _listed(*values: Any) -> Pool:
    return Pool(len(values), values.__getitem__, text=all(isinstance(v, str) for v in values))


def _numbers(start: float, stop: float, step: float) -> Pool:
    """start, start+step, ..., stop; integral values are ints so "70" in a request is 70 in the call."""

    def value(i: int) -> int | float:
        number = round(start + i * step, 2)
        return int(number) if number == int(number) else number

    return Pool(int(round((stop - start) / step)) + 1, value)


def _dates() -> Pool:
    first = date(2025, 1, 1)
    return Pool(730, lambda i: (first + timedelta(days=i)).isoformat())


def _times() -> Pool:
    return Pool(48, lambda i: f"{i // 2:02d}:{30 * (i % 2):02d}")


# fmt: off
POOLS: dict[str, Pool] = {
    # apostrophes on purpose: Glaive quotes arguments with single quotes, so these are the hard cases
    "city": _listed(
        "New York", "Paris", "Tokyo", "Xi'an", "Berlin", "São Paulo", "Nairobi", "Sydney", "Toronto",
        "L'Aquila", "Mumbai", "Cairo", "Reykjavik", "Lima", "Oslo", "St. John's", "Seoul", "Dublin",
        "Cape Town", "Hanoi", "Buenos Aires", "Vancouver", "Lisbon", "Kraków",
    ),
    "currency": _listed(
        "USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR", "CNY", "SEK", "MXN", "BRL", "NZD", "ZAR",
        "KRW", "SGD",
    ),
    "symbol": _listed(
        "AAPL", "MSFT", "GOOGL", "AMZN", "TSLA", "NVDA", "META", "IBM", "ORCL", "INTC", "AMD", "NFLX",
    ),
    "person": _listed(
        "Alice Martin", "Bob O'Connor", "Chen Wei", "Priya Sharma", "Diego Fernández", "Fatima Zahra",
        "John D'Angelo", "Emma Schmidt", "Kenji Sato", "Olivia Brown", "Liam Murphy", "Sofia Rossi",
    ),
    "email": _listed(
        "alice@example.com", "bob.oconnor@example.org", "chen.wei@example.net", "priya@example.com",
        "diego@example.org", "fatima@example.net", "jdangelo@example.com", "emma.s@example.org",
        "kenji@example.net", "olivia@example.com", "liam.m@example.org", "sofia@example.net",
    ),
    "subject": _listed(
        "Meeting tomorrow", "Project update", "Lunch on Friday?", "Quarterly report",
        "Don't forget the deadline", "Happy birthday!", "Travel plans", "Invoice 4411", "Team offsite",
        "Welcome aboard", "Weekly sync notes", "Can't make it today",
    ),
    "message": _listed(
        "I'll be 10 minutes late.", "Please review the attached draft.", "Let's meet at the café at noon.",
        "The build is green again.", "Thanks for your help yesterday!", "Don't forget to bring the slides.",
        "Can we move our call to 3 pm?", "The package arrived safely.", "I've booked the conference room.",
        "See you at Sarah's party.", "The \"final\" version is in the shared folder.",
        "Remember to submit your timesheet.",
    ),
    "ingredient": _listed(
        "chicken", "tomatoes", "rice", "basil", "garlic", "spinach", "mushrooms", "tofu", "salmon",
        "chickpeas", "lemon", "potatoes", "eggs", "cheese", "onion", "broccoli",
    ),
    "movie": _listed(
        "Inception", "The Godfather", "Amélie", "Schindler's List", "Spirited Away", "Casablanca",
        "Parasite", "The Matrix", "Pan's Labyrinth", "Interstellar", "Rashomon", "Heat",
    ),
    "author": _listed(
        "Toni Morrison", "Frank Herbert", "Jane Austen", "Ursula K. Le Guin", "Chinua Achebe",
        "Octavia E. Butler", "George Orwell", "Madeleine L'Engle", "Haruki Murakami",
        "Chimamanda Ngozi Adichie", "Kazuo Ishiguro", "Zadie Smith",
    ),
    "airport": _listed(
        "JFK", "LHR", "CDG", "HND", "SFO", "DXB", "SIN", "FRA", "AMS", "SYD", "GRU", "YYZ", "ICN", "MAD",
        "BCN", "ORD",
    ),
    "language": _listed(
        "French", "German", "Spanish", "Italian", "Japanese", "Portuguese", "Korean", "Dutch", "Swedish",
        "Turkish", "Polish", "Greek",
    ),
    "phrase": _listed(
        "Good morning", "Where is the train station?", "I'd like a coffee, please",
        "How much does this cost?", "Thank you very much", "What time is it?", "I don't understand",
        "Nice to meet you", "Can you help me?", "The bill, please", "I'm lost", "See you tomorrow",
    ),
    "word": _listed(
        "serendipity", "ephemeral", "resilience", "ubiquitous", "melancholy", "eloquent", "paradigm",
        "quixotic", "candor", "benevolent", "meticulous", "nostalgia",
    ),
    "product": _listed(
        "wireless headphones", "standing desk", "espresso machine", "running shoes", "mechanical keyboard",
        "yoga mat", "electric kettle", "hiking backpack", "smartwatch", "air purifier", "children's bicycle",
        "desk lamp",
    ),
    "event": _listed(
        "Team standup", "Dentist appointment", "Mom's birthday dinner", "Quarterly review", "Yoga class",
        "Book club", "Flight to Berlin", "Parent-teacher meeting", "Project kickoff", "Coffee with Ana",
        "Car service", "Farewell party",
    ),
    "task": _listed(
        "Buy groceries", "Call the plumber", "Renew passport", "Finish the report", "Pay rent",
        "Book the dentist", "Clean the garage", "Return library books", "Prepare slides", "Send invoices",
        "Fix the bike", "Update the team's roadmap",
    ),
    "song": _listed(
        "Bohemian Rhapsody", "Imagine", "Hey Jude", "Hotel California", "Billie Jean", "Respect",
        "Wonderwall", "Africa", "Halo", "Yesterday", "Don't Stop Me Now", "Purple Rain",
    ),
    "artist": _listed(
        "Queen", "John Lennon", "The Beatles", "Eagles", "Michael Jackson", "Aretha Franklin", "Oasis",
        "Toto", "Beyoncé", "Prince", "Guns N' Roses", "Adele",
    ),
    "playlist": _listed(
        "Road Trip", "Morning Run", "Focus Mode", "Sunday Chill", "Party Night", "Throwbacks",
        "Rainy Days", "Workout Mix", "Dinner Jazz", "Study Session", "Summer '25", "Sleep",
    ),
    "country": _listed(
        "United States", "France", "Japan", "India", "Brazil", "Kenya", "Canada", "Germany", "Australia",
        "Mexico", "Côte d'Ivoire", "Norway",
    ),
    "url": _listed(
        "https://example.com", "https://example.org/blog/what's-new", "https://news.ycombinator.com",
        "https://github.com/pytorch/pytorch", "https://www.wikipedia.org", "https://docs.python.org/3/",
        "https://arxiv.org", "https://example.net/shop?item=42", "https://pypi.org/project/typer/",
        "https://www.gnu.org/software/bash/", "https://example.com/docs/getting-started",
        "https://kernel.org",
    ),
    "alias": _listed(
        "my-blog", "shop42", "docs-home", "launch", "promo-spring", "team-wiki", "cv", "talk-slides",
        "signup", "release-notes", "demo", "faq",
    ),
    "tracking": Pool(400, lambda i: f"1Z{(i * 7919 + 104729) % 10**8:08d}"),
    "date": _dates(),
    "time": _times(),
    "amount": _numbers(5, 5000, 5),
    "price": _numbers(1, 2000, 0.5),
    "percent": _numbers(5, 90, 5),
    "tip_percent": _numbers(5, 30, 1),
    "rate": _numbers(0.5, 15, 0.25),
    "principal": _numbers(1000, 500000, 500),
    "years": _numbers(1, 40, 1),
    "weight_kg": _numbers(40, 150, 0.5),
    "height_m": _numbers(1.4, 2.1, 0.01),
    "measure": _numbers(1, 1000, 0.5),
    "temperature": _numbers(-40, 120, 1),
    "integer": _numbers(-500, 500, 1),
    "small_integer": _numbers(0, 20, 1),
    "prime_candidate": _numbers(2, 10000, 1),
    "days": _numbers(1, 10, 1),
    "nights": _numbers(1, 14, 1),
    "count": _numbers(1, 6, 1),
    "minutes": _numbers(15, 240, 15),
    "grams": _numbers(10, 1000, 10),
    "year": _numbers(1940, 2024, 1),
    "password_length": _numbers(8, 64, 1),
    "pixels": _numbers(100, 1000, 50),
    "radius": _numbers(0.5, 100, 0.5),
    "coefficient": _numbers(1, 20, 1),
    "birth_date": Pool(2800, lambda i: (date(1950, 1, 1) + timedelta(days=7 * i)).isoformat()),
}
# fmt: on

# Other spellings of a listed value that mean the same thing to anyone reading the request (BFCL's ground
# truth lists such alternatives per parameter: "San Francisco, CA" and "SF"). A value with a letter
# outside ASCII is also accepted without its accents (catalogue.alternatives).
ALIASES: dict[str, tuple[str, ...]] = {
    "New York": ("New York City", "NYC", "New York, NY"),
    "St. John's": ("Saint John's", "St John's"),
    "Xi'an": ("Xian",),
    "Buenos Aires": ("Buenos Aires, Argentina",),
    "Cape Town": ("Cape Town, South Africa",),
    "United States": ("USA", "US", "United States of America"),
    "Côte d'Ivoire": ("Ivory Coast",),
    "The Beatles": ("Beatles",),
    "Guns N' Roses": ("Guns N Roses", "Guns and Roses"),
    "Eagles": ("The Eagles",),
    "https://www.wikipedia.org": ("https://wikipedia.org",),
}


def _req(name: str, kind: Any, description: str, pool: str = "", **extra: Any) -> Param:
    return Param(name, kind, description, pool, **extra)


def _opt(name: str, kind: Any, description: str, pool: str, phrase: str, **extra: Any) -> Param:
    return Param(name, kind, description, pool, required=False, phrase=phrase, **extra)


CONDITIONS = ("sunny", "cloudy", "rainy", "partly cloudy", "snowy", "windy", "foggy")
TEMP_UNITS = ("celsius", "fahrenheit")
CUISINES = ("italian", "mexican", "indian", "japanese", "french", "thai")
LENGTH_UNITS = ("meters", "feet", "miles", "kilometers", "inches")
WEIGHT_UNITS = ("kilograms", "pounds", "ounces", "grams")
TEMPERATURE_SCALES = ("celsius", "fahrenheit", "kelvin")
PRIORITIES = ("low", "medium", "high")
NEWS = ("business", "technology", "sports", "science", "health", "entertainment")
GENRES = ("fiction", "science fiction", "mystery", "fantasy", "history")


def _f(
    name: str,
    description: str,
    params: Sequence[Param],
    asks: Sequence[str],
    result: Callable[[dict[str, Any], random.Random], dict[str, Any]],
    answer: str,
) -> FunctionSpec:
    return FunctionSpec(name, description, tuple(params), tuple(asks), result, answer)


CATALOGUE: tuple[FunctionSpec, ...] = (
    # weather
    _f(
        "get_current_weather",
        "Get the current weather for a city",
        [
            _req("city", "string", "The city name", "city"),
            _opt("unit", "string", "The temperature unit", "", " Give it in {unit}.", enum=TEMP_UNITS),
        ],
        ["What's the weather like in {city} right now?", "Can you check the current weather in {city}?"],
        lambda a, r: {"temperature": r.randint(-5, 35), "condition": r.choice(CONDITIONS)},
        "It's currently {temperature} degrees and {condition} in {city}.",
    ),
    _f(
        "get_weather_forecast",
        "Get the weather forecast for the next days",
        [
            _req("city", "string", "The city name", "city"),
            _req("days", "integer", "Number of days to forecast", "days"),
        ],
        [
            "What will the weather be in {city} over the next {days} days?",
            "Forecast for {city}, {days} days.",
        ],
        lambda a, r: {"summary": r.choice(CONDITIONS), "high": r.randint(5, 35), "low": r.randint(-10, 4)},
        "Over the next {days} days {city} will be mostly {summary}, with highs of {high} and lows of {low}.",
    ),
    # currency and finance
    _f(
        "convert_currency",
        "Convert an amount from one currency to another",
        [
            _req("amount", "number", "The amount to convert", "amount"),
            _req("from_currency", "string", "The currency to convert from", "currency"),
            _req("to_currency", "string", "The currency to convert to", "currency"),
        ],
        [
            "Hi, I need to convert {amount} {from_currency} to {to_currency}.",
            "How much is {amount} {from_currency} in {to_currency}?",
        ],
        lambda a, r: {"converted_amount": round(a["amount"] * r.uniform(0.2, 3), 2)},
        "{amount} {from_currency} is about {converted_amount} {to_currency}.",
    ),
    _f(
        "get_exchange_rate",
        "Get the exchange rate between two currencies",
        [
            _req("base_currency", "string", "The base currency", "currency"),
            _req("target_currency", "string", "The target currency", "currency"),
        ],
        [
            "What's the exchange rate from {base_currency} to {target_currency}?",
            "Tell me the {base_currency} to {target_currency} rate.",
        ],
        lambda a, r: {"rate": round(r.uniform(0.01, 150), 4)},
        "One {base_currency} is worth {rate} {target_currency} right now.",
    ),
    _f(
        "get_stock_price",
        "Get the latest price of a stock",
        [
            _req("symbol", "string", "The stock ticker symbol", "symbol"),
            _opt(
                "exchange", "string", "The exchange", "", " It trades on {exchange}.", enum=("NASDAQ", "NYSE")
            ),
        ],
        ["What's the current price of {symbol} stock?", "How is {symbol} trading today?"],
        lambda a, r: {"price": round(r.uniform(10, 900), 2), "currency": "USD"},
        "{symbol} is trading at {price} {currency}.",
    ),
    _f(
        "calculate_loan_payment",
        "Calculate the monthly payment of a loan",
        [
            _req("principal", "number", "The loan amount", "principal"),
            _req("interest_rate", "number", "The annual interest rate in percent", "rate"),
            _req("loan_term_years", "integer", "The loan term in years", "years"),
        ],
        [
            "I'm taking a loan of {principal} at {interest_rate}% for {loan_term_years} years. What's my "
            "monthly payment?",
            "Monthly payment for a {principal} loan, {interest_rate}% interest, {loan_term_years} years?",
        ],
        lambda a, r: {"monthly_payment": round(r.uniform(50, 5000), 2)},
        "Your monthly payment would be {monthly_payment}.",
    ),
    _f(
        "calculate_tip",
        "Calculate the tip for a bill",
        [
            _req("bill_amount", "number", "The total bill", "price"),
            _req("tip_percentage", "integer", "The tip percentage", "tip_percent"),
        ],
        [
            "My bill is {bill_amount}. How much is a {tip_percentage}% tip?",
            "Work out a {tip_percentage} percent tip on {bill_amount}, please.",
        ],
        lambda a, r: {"tip_amount": round(a["bill_amount"] * a["tip_percentage"] / 100, 2)},
        "A {tip_percentage}% tip on {bill_amount} is {tip_amount}.",
    ),
    _f(
        "calculate_discount",
        "Calculate the price after a discount",
        [
            _req("original_price", "number", "The original price", "price"),
            _req("discount_percentage", "number", "The discount in percent", "percent"),
        ],
        [
            "I saw a jacket for {original_price} with {discount_percentage}% off. What will it cost?",
            "What's {original_price} minus a {discount_percentage}% discount?",
        ],
        lambda a, r: {
            "discounted_price": round(a["original_price"] * (1 - a["discount_percentage"] / 100), 2)
        },
        "After the discount it costs {discounted_price}.",
    ),
    _f(
        "calculate_compound_interest",
        "Calculate compound interest on an investment",
        [
            _req("principal", "number", "The initial investment", "principal"),
            _req("rate", "number", "The annual interest rate in percent", "rate"),
            _req("years", "integer", "The number of years", "years"),
            _opt(
                "compounds_per_year",
                "integer",
                "Compounding periods per year",
                "count",
                " Compound it {compounds_per_year} times a year.",
            ),
        ],
        [
            "If I invest {principal} at {rate}% for {years} years, what will I have?",
            "Compound interest on {principal} at {rate} percent over {years} years?",
        ],
        lambda a, r: {"final_amount": round(a["principal"] * (1 + a["rate"] / 100) ** a["years"], 2)},
        "You would have {final_amount} after {years} years.",
    ),
    # calendar and productivity
    _f(
        "create_calendar_event",
        "Create an event in the calendar",
        [
            _req("title", "string", "The title of the event", "event"),
            _req("date", "string", "The date, YYYY-MM-DD", "date"),
            _req("start_time", "string", "The start time, HH:MM", "time"),
            _opt(
                "duration_minutes",
                "integer",
                "The duration in minutes",
                "minutes",
                " It lasts {duration_minutes} minutes.",
            ),
            _opt("location", "string", "Where it takes place", "city", " It's in {location}."),
        ],
        [
            "Please add '{title}' to my calendar on {date} at {start_time}.",
            "Schedule {title} for {date}, starting {start_time}.",
        ],
        lambda a, r: {"status": "created", "event_id": f"evt_{r.randint(1000, 9999)}"},
        "Done! '{title}' is on your calendar for {date} at {start_time}.",
    ),
    _f(
        "create_todo",
        "Create a new item in the to-do list",
        [
            _req("task", "string", "What needs to be done", "task"),
            _opt("due_date", "string", "The due date, YYYY-MM-DD", "date", " It's due {due_date}."),
            _opt("priority", "string", "The priority", "", " Mark it {priority} priority.", enum=PRIORITIES),
        ],
        ["Add '{task}' to my to-do list.", "I need a to-do item: {task}."],
        lambda a, r: {"status": "success", "todo_id": r.randint(1, 999)},
        "I've added '{task}' to your to-do list.",
    ),
    _f(
        "set_reminder",
        "Set a reminder at a date and time",
        [
            _req("message", "string", "What to be reminded of", "message"),
            _req("date", "string", "The date, YYYY-MM-DD", "date"),
            _req("time", "string", "The time, HH:MM", "time"),
        ],
        ["Remind me on {date} at {time}: {message}", 'Set a reminder for {date} {time} saying "{message}"'],
        lambda a, r: {"status": "scheduled"},
        "Your reminder is set for {date} at {time}.",
    ),
    _f(
        "send_email",
        "Send an email to a recipient",
        [
            _req("recipient", "string", "The recipient's email address", "email"),
            _req("subject", "string", "The subject", "subject"),
            _req("body", "string", "The message body", "message"),
            _opt("cc", "array", "Addresses to copy", "email", " Copy {cc}.", items="string"),
        ],
        [
            "Please email {recipient} with the subject '{subject}' and say: {body}",
            "Send an email to {recipient}. Subject: {subject}. Message: {body}",
        ],
        lambda a, r: {"status": "sent"},
        "Your email to {recipient} has been sent.",
    ),
    _f(
        "schedule_meeting",
        "Schedule a meeting with several participants",
        [
            _req("participants", "array", "The participants' email addresses", "email", items="string"),
            _req("date", "string", "The date, YYYY-MM-DD", "date"),
            _req("time", "string", "The time, HH:MM", "time"),
        ],
        [
            "Set up a meeting with {participants} on {date} at {time}.",
            "Can you schedule a meeting on {date} at {time} with {participants}?",
        ],
        lambda a, r: {"status": "scheduled", "meeting_id": f"m-{r.randint(100, 999)}"},
        "The meeting on {date} at {time} is scheduled and invitations are sent.",
    ),
    # math
    _f(
        "calculate_average",
        "Calculate the average of a list of numbers",
        [_req("numbers", "array", "The numbers", "integer", items="number")],
        ["What's the average of {numbers}?", "Calculate the mean of these numbers: {numbers}."],
        lambda a, r: {"average": round(sum(a["numbers"]) / len(a["numbers"]), 3)},
        "The average is {average}.",
    ),
    _f(
        "calculate_factorial",
        "Calculate the factorial of a number",
        [_req("number", "integer", "A non-negative integer", "small_integer")],
        ["What is the factorial of {number}?", "Compute {number}!"],
        lambda a, r: {"factorial": math.factorial(a["number"])},
        "The factorial of {number} is {factorial}.",
    ),
    _f(
        "check_prime",
        "Check whether a number is prime",
        [_req("number", "integer", "The number to check", "prime_candidate")],
        ["Is {number} a prime number?", "Check if {number} is prime."],
        lambda a, r: {
            "result": "prime"
            if all(a["number"] % d for d in range(2, int(a["number"] ** 0.5) + 1))
            else "not prime"
        },
        "{number} is {result}.",
    ),
    _f(
        "calculate_circle_area",
        "Calculate the area of a circle",
        [_req("radius", "number", "The radius", "radius")],
        ["What's the area of a circle with radius {radius}?", "Circle area for a radius of {radius}?"],
        lambda a, r: {"area": round(3.141592653589793 * a["radius"] ** 2, 2)},
        "The area is {area}.",
    ),
    _f(
        "calculate_bmi",
        "Calculate the body mass index",
        [
            _req("weight_kg", "number", "Weight in kilograms", "weight_kg"),
            _req("height_m", "number", "Height in meters", "height_m"),
        ],
        [
            "I weigh {weight_kg} kg and I'm {height_m} m tall. What's my BMI?",
            "Calculate my BMI: {weight_kg} kilograms, {height_m} meters.",
        ],
        lambda a, r: {"bmi": round(a["weight_kg"] / a["height_m"] ** 2, 1)},
        "Your BMI is {bmi}.",
    ),
    _f(
        "calculate_percentage",
        "Calculate what percentage one number is of another",
        [
            _req("part", "number", "The part", "measure"),
            _req("total", "number", "The total", "principal"),
        ],
        ["What percentage of {total} is {part}?", "{part} out of {total} is how many percent?"],
        lambda a, r: {"percentage": round(100 * a["part"] / a["total"], 3)},
        "{part} is {percentage}% of {total}.",
    ),
    _f(
        "solve_quadratic",
        "Solve a quadratic equation a*x^2 + b*x + c = 0",
        [
            _req("a", "number", "The coefficient of x^2", "coefficient"),
            _req("b", "number", "The coefficient of x", "integer"),
            _req("c", "number", "The constant term", "integer"),
        ],
        ["Solve {a}x^2 + {b}x + {c} = 0.", "Find the roots of the equation with a={a}, b={b}, c={c}."],
        lambda a, r: {"discriminant": a["b"] ** 2 - 4 * a["a"] * a["c"]},
        "The discriminant is {discriminant}, which tells us how many real roots there are.",
    ),
    # units
    _f(
        "convert_temperature",
        "Convert a temperature between scales",
        [
            _req("value", "number", "The temperature", "temperature"),
            _req("from_unit", "string", "The scale to convert from", enum=TEMPERATURE_SCALES),
            _req("to_unit", "string", "The scale to convert to", enum=TEMPERATURE_SCALES),
        ],
        ["Convert {value} degrees {from_unit} to {to_unit}.", "What is {value} {from_unit} in {to_unit}?"],
        lambda a, r: {"converted": round(r.uniform(-50, 400), 2)},
        "{value} {from_unit} is {converted} {to_unit}.",
    ),
    _f(
        "convert_length",
        "Convert a length between units",
        [
            _req("value", "number", "The length", "measure"),
            _req("from_unit", "string", "The unit to convert from", enum=LENGTH_UNITS),
            _req("to_unit", "string", "The unit to convert to", enum=LENGTH_UNITS),
        ],
        ["How many {to_unit} are {value} {from_unit}?", "Convert {value} {from_unit} into {to_unit}."],
        lambda a, r: {"converted": round(r.uniform(0.1, 5000), 3)},
        "{value} {from_unit} is {converted} {to_unit}.",
    ),
    _f(
        "convert_weight",
        "Convert a weight between units",
        [
            _req("value", "number", "The weight", "measure"),
            _req("from_unit", "string", "The unit to convert from", enum=WEIGHT_UNITS),
            _req("to_unit", "string", "The unit to convert to", enum=WEIGHT_UNITS),
        ],
        ["Convert {value} {from_unit} to {to_unit}.", "How much is {value} {from_unit} in {to_unit}?"],
        lambda a, r: {"converted": round(r.uniform(0.1, 5000), 3)},
        "{value} {from_unit} equals {converted} {to_unit}.",
    ),
    # travel
    _f(
        "search_flights",
        "Search for flights between two airports",
        [
            _req("origin", "string", "The departure airport code", "airport"),
            _req("destination", "string", "The arrival airport code", "airport"),
            _req("departure_date", "string", "The departure date, YYYY-MM-DD", "date"),
            _opt(
                "passengers", "integer", "The number of passengers", "count", " We are {passengers} people."
            ),
            _opt(
                "nonstop",
                "boolean",
                "Only nonstop flights",
                "",
                " {nonstop}",
                bool_text=("Stops are fine.", "Nonstop only, please."),
            ),
        ],
        [
            "Find me flights from {origin} to {destination} on {departure_date}.",
            "Are there flights {origin} -> {destination} on {departure_date}?",
        ],
        lambda a, r: {"cheapest_price": r.randint(80, 1500), "airline": r.choice(("Aurora Air", "Blue Jet"))},
        "The cheapest flight from {origin} to {destination} is {cheapest_price} USD with {airline}.",
    ),
    _f(
        "search_hotels",
        "Search for hotels in a city",
        [
            _req("city", "string", "The city", "city"),
            _req("check_in_date", "string", "The check-in date, YYYY-MM-DD", "date"),
            _req("nights", "integer", "The number of nights", "nights"),
            _opt(
                "max_price_per_night",
                "number",
                "The highest price per night",
                "price",
                " No more than {max_price_per_night} a night.",
            ),
        ],
        [
            "I need a hotel in {city} from {check_in_date} for {nights} nights.",
            "Look for hotels in {city}, checking in {check_in_date}, staying {nights} nights.",
        ],
        lambda a, r: {
            "hotel": r.choice(("Hotel Central", "The Harbour Inn", "Casa Verde")),
            "price_per_night": r.randint(40, 400),
        },
        "{hotel} in {city} has rooms for {price_per_night} a night.",
    ),
    _f(
        "get_distance",
        "Get the distance between two cities",
        [
            _req("origin", "string", "The starting city", "city"),
            _req("destination", "string", "The destination city", "city"),
            _opt("unit", "string", "The distance unit", "", " In {unit}, please.", enum=("km", "miles")),
        ],
        [
            "How far is {origin} from {destination}?",
            "What's the distance between {origin} and {destination}?",
        ],
        lambda a, r: {"distance": r.randint(10, 18000)},
        "The distance between {origin} and {destination} is {distance}.",
    ),
    _f(
        "get_local_time",
        "Get the current local time in a city",
        [_req("city", "string", "The city", "city")],
        ["What time is it in {city}?", "Tell me the local time in {city}."],
        lambda a, r: {"local_time": f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"},
        "It's {local_time} in {city}.",
    ),
    _f(
        "translate_text",
        "Translate text into another language",
        [
            _req("text", "string", "The text to translate", "phrase"),
            _req("target_language", "string", "The language to translate into", "language"),
            _opt(
                "source_language",
                "string",
                "The language of the text",
                "language",
                " The text is in {source_language}.",
            ),
        ],
        ["How do you say '{text}' in {target_language}?", 'Translate "{text}" to {target_language}.'],
        lambda a, r: {"translated_text": f"[{a['target_language']}] {a['text']}"},
        "In {target_language}: {translated_text}",
    ),
    # food
    _f(
        "search_recipes",
        "Search for recipes by ingredients",
        [
            _req("ingredients", "array", "Ingredients to use", "ingredient", items="string"),
            _opt("cuisine", "string", "The cuisine", "", " Something {cuisine}.", enum=CUISINES),
            _opt(
                "max_prep_time_minutes",
                "integer",
                "The longest preparation time",
                "minutes",
                " It must be ready within {max_prep_time_minutes} minutes.",
            ),
        ],
        ["I have {ingredients}. What can I cook?", "Find me a recipe with {ingredients}."],
        lambda a, r: {
            "recipe": r.choice(("One-pan bake", "Quick stir-fry", "Hearty soup", "Fresh salad")),
            "prep_time_minutes": r.randint(10, 90),
        },
        "Try a {recipe}: it takes about {prep_time_minutes} minutes.",
    ),
    _f(
        "get_nutrition_info",
        "Get nutrition facts for a food",
        [
            _req("food", "string", "The food", "ingredient"),
            _req("quantity_grams", "integer", "The quantity in grams", "grams"),
        ],
        [
            "How many calories are in {quantity_grams} grams of {food}?",
            "Nutrition facts for {quantity_grams} g of {food}, please.",
        ],
        lambda a, r: {"calories": r.randint(5, 900), "protein_g": r.randint(0, 60)},
        "{quantity_grams} g of {food} has {calories} calories and {protein_g} g of protein.",
    ),
    _f(
        "find_restaurants",
        "Find restaurants in a city",
        [
            _req("city", "string", "The city", "city"),
            _req("cuisine", "string", "The cuisine", enum=CUISINES),
            _opt(
                "price_range",
                "string",
                "The price range",
                "",
                " Keep it {price_range}.",
                enum=("$", "$$", "$$$"),
            ),
        ],
        ["Any good {cuisine} restaurants in {city}?", "Find {cuisine} food in {city}."],
        lambda a, r: {
            "restaurant": r.choice(("Luna", "The Corner Table", "Saffron", "Nori House")),
            "rating": round(r.uniform(3.5, 5), 1),
        },
        "{restaurant} is a {cuisine} place in {city} rated {rating}.",
    ),
    # media
    _f(
        "get_movie_details",
        "Get details about a movie",
        [
            _req("title", "string", "The title of the movie", "movie"),
            _opt("year", "integer", "The release year", "year", " The one from {year}."),
        ],
        ["Tell me about the movie {title}.", 'What can you tell me about "{title}"?'],
        lambda a, r: {
            "director": r.choice(("A. Director", "B. Filmmaker")),
            "rating": round(r.uniform(6, 9.5), 1),
        },
        "{title} was directed by {director} and is rated {rating}.",
    ),
    _f(
        "search_books",
        "Search for books by an author",
        [
            _req("author", "string", "The author", "author"),
            _opt("genre", "string", "The genre", "", " Only {genre}.", enum=GENRES),
        ],
        ["Which books did {author} write?", "Find books by {author}."],
        lambda a, r: {"count": r.randint(1, 30)},
        "I found {count} books by {author}.",
    ),
    _f(
        "get_song_lyrics",
        "Get the lyrics of a song",
        [
            _req("song_title", "string", "The song title", "song"),
            _opt("artist", "string", "The artist", "artist", " It's by {artist}."),
        ],
        ["Can you get me the lyrics of {song_title}?", 'I want the lyrics to "{song_title}".'],
        lambda a, r: {"lyrics": "La la la, la la la..."},
        "Here are the lyrics of {song_title}: {lyrics}",
    ),
    _f(
        "create_playlist",
        "Create a music playlist",
        [
            _req("name", "string", "The playlist name", "playlist"),
            _req("songs", "array", "The songs", "song", items="string"),
        ],
        ["Make a playlist called '{name}' with {songs}.", "Create the playlist {name}: {songs}."],
        lambda a, r: {"status": "created", "song_count": len(a["songs"])},
        "Your playlist '{name}' is ready with {song_count} songs.",
    ),
    _f(
        "get_news_headlines",
        "Get the latest news headlines",
        [
            _req("category", "string", "The news category", enum=NEWS),
            _opt("country", "string", "The country", "country", " For {country}."),
        ],
        ["What's the latest {category} news?", "Show me today's {category} headlines."],
        lambda a, r: {"headline": r.choice(("Markets rally", "New discovery announced", "Record broken"))},
        "Top {category} story: {headline}.",
    ),
    # utilities
    _f(
        "generate_password",
        "Generate a random password",
        [
            _req("length", "integer", "The length of the password", "password_length"),
            _req(
                "include_symbols",
                "boolean",
                "Whether to include symbols",
                "",
                bool_text=("without symbols", "with symbols"),
            ),
            _opt(
                "include_numbers",
                "boolean",
                "Whether to include digits",
                "",
                " {include_numbers}",
                bool_text=("No digits.", "Include digits."),
            ),
        ],
        [
            "I need a new password, {length} characters long, {include_symbols}.",
            "Generate a {length}-character password {include_symbols}.",
        ],
        lambda a, r: {"password": "".join(r.choice("abcdefghjkmnpqrstuvwxyz") for _ in range(a["length"]))},
        "Here is your new password: {password}",
    ),
    _f(
        "generate_qr_code",
        "Generate a QR code for some data",
        [
            _req("data", "string", "The data to encode", "url"),
            _opt("size", "integer", "The size in pixels", "pixels", " Make it {size} pixels."),
        ],
        ["Create a QR code for {data}.", "I need a QR code that points to {data}."],
        lambda a, r: {"qr_code_url": f"https://qr.example/{r.randint(10000, 99999)}.png"},
        "Here is your QR code: {qr_code_url}",
    ),
    _f(
        "check_website_status",
        "Check whether a website is up",
        [_req("url", "string", "The website URL", "url")],
        ["Is {url} down?", "Can you check if {url} is up?"],
        lambda a, r: {"status": r.choice(("up", "down")), "response_time_ms": r.randint(20, 900)},
        "{url} is {status} (response time {response_time_ms} ms).",
    ),
    _f(
        "get_word_definition",
        "Get the definition of a word",
        [_req("word", "string", "The word", "word")],
        ["What does '{word}' mean?", "Define the word {word}."],
        lambda a, r: {"definition": "a word with a meaning"},
        "'{word}' means {definition}.",
    ),
    _f(
        "shorten_url",
        "Shorten a long URL",
        [
            _req("url", "string", "The URL to shorten", "url"),
            _opt("custom_alias", "string", "A custom alias", "alias", " Use the alias {custom_alias}."),
        ],
        ["Shorten this link: {url}", "Can you make {url} shorter?"],
        lambda a, r: {"short_url": f"https://sho.rt/{r.randint(1000, 9999)}"},
        "Here is the short link: {short_url}",
    ),
    _f(
        "track_package",
        "Track a package",
        [
            _req("tracking_number", "string", "The tracking number", "tracking"),
            _opt(
                "carrier", "string", "The carrier", "", " It's with {carrier}.", enum=("UPS", "FedEx", "DHL")
            ),
        ],
        ["Where is my package {tracking_number}?", "Track package {tracking_number}, please."],
        lambda a, r: {"status": r.choice(("in transit", "out for delivery", "delivered"))},
        "Package {tracking_number} is {status}.",
    ),
    _f(
        "get_random_quote",
        "Get a random quote",
        [
            _opt(
                "category",
                "string",
                "The category",
                "",
                " Make it about {category}.",
                enum=("inspiration", "humor", "life", "success"),
            )
        ],
        ["Give me a quote.", "I could use a good quote today."],
        lambda a, r: {"quote": "The best way out is always through.", "author": "Robert Frost"},
        '"{quote}" - {author}',
    ),
    _f(
        "calculate_age",
        "Calculate someone's age from their birth date",
        [_req("birth_date", "string", "The birth date, YYYY-MM-DD", "birth_date")],
        ["I was born on {birth_date}. How old am I?", "How old is someone born {birth_date}?"],
        lambda a, r: {"age": 2026 - int(a["birth_date"][:4])},
        "That makes {age} years.",
    ),
    _f(
        "search_products",
        "Search an online shop for products",
        [
            _req("query", "string", "What to look for", "product"),
            _opt("max_price", "number", "The highest price", "price", " Under {max_price}."),
            _opt(
                "in_stock_only",
                "boolean",
                "Only products in stock",
                "",
                " {in_stock_only}",
                bool_text=("Out of stock is fine.", "Only what's in stock."),
            ),
        ],
        ["I'm looking for a {query}.", "Search the shop for {query}."],
        lambda a, r: {"results": r.randint(0, 50), "best_price": round(r.uniform(5, 900), 2)},
        "I found {results} results for {query}, starting at {best_price}.",
    ),
    _f(
        "get_contact_info",
        "Look up a contact in the address book",
        [_req("name", "string", "The contact's full name", "person")],
        ["What's {name}'s phone number?", "Look up {name} in my contacts."],
        lambda a, r: {"phone": f"+1-555-{r.randint(1000, 9999)}"},
        "{name}'s number is {phone}.",
    ),
)

BY_NAME: dict[str, FunctionSpec] = {spec.name: spec for spec in CATALOGUE}
if len(BY_NAME) != len(CATALOGUE):  # a duplicate name would make two schemas indistinguishable
    raise RuntimeError("duplicate function name in the catalogue")
