"""The mail of one generated inbox: fact events (a booking, an invite, an invoice...) and filler, and their questions.

Offline only: :mod:`environments.email.corpus` runs these makers once and the output is committed. Each fact event
writes its messages into the inbox and asks questions about them, each with the hops a searcher takes to the answer;
many add a distractor (an earlier booking, a moved meeting, a corrected invoice) that a careless searcher answers
from. Everything is printable ASCII and terse: the default policy reads one character per token.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

MAX_BODY_CHARS = 250
MAX_QUESTION_CHARS = 90

COLLEAGUES = (
    "Lena Park", "Omar Haddad", "Rita Gomez", "Tom Becker", "Ivy Chen", "Raj Patel", "Sara Berg",
    "Yuki Mori", "Paul Novak", "Nina Kaur", "Leo Costa", "Mia Jensen", "Hugo Brandt", "Zoe Adams",
)  # fmt: skip
FRIENDS = ("Jo", "Max", "Eva", "Sam", "Kai", "Lily", "Noah", "Ella", "Finn", "Ruby", "Theo", "Iris")
CITIES = (
    "Oslo", "Lisbon", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Dublin", "Paris", "Athens",
    "Zurich", "Warsaw", "Porto", "Milan", "Munich", "Bergen", "Lyon", "Seville", "Krakow", "Nice",
)  # fmt: skip
AIRLINES = (("skyair.com", "SA"), ("flynord.com", "FN"), ("aerolux.com", "AL"), ("bluejet.com", "BJ"))
HOTELS = (
    "Hotel Astra", "Park Inn", "The Linden", "Harbor House", "Casa Sol", "Hotel Nova", "Grand Vista",
    "The Alder", "Villa Rosa", "Hotel Bruno", "City Loft", "Old Mill Inn",
)  # fmt: skip
TOPICS = (
    "budget review", "Q3 roadmap", "design sync", "hiring plan", "sales kickoff", "launch prep",
    "vendor call", "team retro", "board prep", "pricing review", "ops review", "security audit",
    "onboarding", "brand workshop", "data migration", "QBR", "offsite planning", "API review",
)  # fmt: skip
ROOMS = ("2A", "2C", "3B", "3D", "4A", "4F", "5B", "6C", "Oak", "Birch", "Cedar", "Maple", "Pine", "Elm")
TIMES = ("08:30", "09:00", "09:30", "10:00", "10:30", "11:00", "13:00", "13:30", "14:00", "15:00", "15:30", "16:00")
VENDORS = (
    ("CloudNest", "cloudnest.io", "web hosting"), ("PrintCo", "printco.com", "printing"),
    ("Sparkle", "sparkle.biz", "office cleaning"), ("Bean Bros", "beanbros.com", "coffee supply"),
    ("NetFix", "netfix.io", "IT support"), ("Feast", "feast.co", "catering"),
    ("Lexa Law", "lexalaw.com", "legal advice"), ("Movers", "movers.net", "moving"),
)  # fmt: skip
SHOPS = (("Shoply", "shoply.com"), ("HomeHub", "homehub.com"), ("TechMart", "techmart.com"))
CARRIERS = ("fastship.com", "parcelgo.com", "quickpost.com")
ITEMS = (
    "desk lamp", "yoga mat", "coffee grinder", "wireless mouse", "rain jacket", "water bottle",
    "office chair", "phone case", "backpack", "standing desk", "air purifier", "kettle",
    "headphones", "monitor arm", "webcam", "blender", "rice cooker", "running shoes", "umbrella",
    "wall clock", "bookshelf", "toaster", "hiking boots", "desk fan", "notebook set", "keyboard",
    "tent", "sleeping bag", "bike helmet", "plant pot", "bath towels", "cutting board", "mixer",
    "duvet", "floor lamp", "picture frame", "travel mug", "tablet stand", "power bank", "scarf",
)  # fmt: skip
RESTAURANTS = (
    "Luigi", "Sakura", "El Toro", "Green Fork", "Bistro 9", "The Pier", "Curry House", "Noma Cafe",
    "Pho Bar", "Blue Olive", "Taco Loco", "Dim Sum Co",
)  # fmt: skip
CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
YEAR_START = date(2024, 1, 3)
YEAR_DAYS = 350


@dataclass
class Draft:
    """A message before ids are assigned (ids follow the sending order)."""

    key: int
    sent: datetime
    sender: str
    recipient: str
    subject: str
    body: str
    reply_to: int | None = None


@dataclass(frozen=True)
class Hop:
    """One step of finding an answer: search, take the newest hit with every ``match`` string and ``field``.

    ``keywords`` are the queries a good searcher would try, broadest first; the question keeps
    the first that works (see :func:`_search_plan`).
    """

    keywords: tuple[str, ...]
    match: tuple[str, ...]
    field: str
    source: int  # Draft key the generator meant


@dataclass
class Question:
    kind: str
    text: str
    answer: str
    hops: list[Hop]
    group: int = 0


@dataclass
class Inbox:
    owner: str
    address: str
    drafts: list[Draft] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)



class Maker:
    """Random choices and message construction for one inbox."""

    def __init__(self, rng: random.Random, inbox: Inbox) -> None:
        self.rng, self.inbox = rng, inbox
        self.first = inbox.owner.split()[0]
        self.used: set[str] = set()

    def unique(self, make: Callable[[], str]) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def code(self, n: int = 6) -> str:
        return self.unique(lambda: "".join(self.rng.choice(CODE_CHARS) for _ in range(n)))

    def digits(self, n: int, prefix: str = "") -> str:
        return self.unique(lambda: prefix + str(self.rng.randint(10 ** (n - 1), 10**n - 1)))

    def sent(self, after: datetime | None = None, within: int = YEAR_DAYS) -> datetime:
        """A new thread's time (any day, office-ish hours), or a reply's within ``within`` days of ``after``."""
        if after is None:
            moment = datetime.combine(YEAR_START, datetime.min.time())
            moment += timedelta(minutes=self.rng.randint(0, YEAR_DAYS * 24 * 60))
            moment = moment.replace(hour=self.rng.randint(7, 21))
        else:
            moment = after + timedelta(hours=1, minutes=self.rng.randint(0, within * 24 * 60))
        return moment.replace(second=0, microsecond=0)

    def day_after(self, moment: datetime, low: int, high: int) -> str:
        return (moment.date() + timedelta(days=self.rng.randint(low, high))).isoformat()

    def add(
        self, sent: datetime, sender: str, subject: str, body: str, *, reply_to: int | None = None, to: str = ""
    ) -> int:
        if len(body) > MAX_BODY_CHARS:
            raise AssertionError(f"body over {MAX_BODY_CHARS} chars: {body!r}")
        key = len(self.inbox.drafts)
        self.inbox.drafts.append(Draft(key, sent, sender, to or self.inbox.address, subject, body, reply_to))
        return key

    def ask(self, kind: str, text: str, answer: str, *hops: Hop) -> None:
        if len(text) > MAX_QUESTION_CHARS:
            raise AssertionError(f"question over {MAX_QUESTION_CHARS} chars: {text!r}")
        self.inbox.questions.append(Question(kind, text, answer, list(hops)))

    def some(self, options: Sequence[str]) -> list[str]:
        """One or more of ``options``, in random order."""
        return self.rng.sample(list(options), self.rng.randint(1, len(options)))


def _person_address(name: str, domain: str = "acme.co") -> str:
    return f"{name.split()[0].lower()}@{domain}"


def _flight(m: Maker) -> None:
    city = m.rng.choice(CITIES)
    domain, prefix = m.rng.choice(AIRLINES)
    asks = {
        "Code": ("What is my confirmation code for the {city} flight on {day}?", "Code for my {day} flight to {city}?"),
        "Seat": ("Which seat do I have on the {day} flight to {city}?", "My seat on the flight to {city} on {day}?"),
        "Flight": ("What is the flight number of my {day} trip to {city}?",),
    }
    # sometimes a second trip to the same city on another date: the question's date tells them apart
    for _ in range(2 if m.rng.random() < 0.6 else 1):
        sent = m.sent()
        day = m.day_after(sent, 5, 60)
        flight, code = m.digits(4, prefix), m.code()
        facts = {"Flight": flight, "Code": code, "Seat": f"{m.rng.randint(1, 38)}{m.rng.choice('ABCDEF')}"}
        body = (
            f"Hi {m.first}, your trip to {city} is confirmed.\nFlight: {facts['Flight']}\nDate: {day}\n"
            f"Code: {facts['Code']}\nSeat: {facts['Seat']}"
        )
        key = m.add(sent, f"trips@{domain}", f"Flight to {city}", body)
        for label in m.some(asks):
            text = m.rng.choice(asks[label]).format(city=city, day=day)
            hop = Hop((f"flight {city}", f"{city} {day}"), (city, day), label, key)
            m.ask(f"flight_{label.lower()}", text, facts[label], hop)


def _hotel(m: Maker) -> None:
    city = m.rng.choice(CITIES)
    hotel, other_hotel = m.rng.sample(HOTELS, 2)
    sender = "bookings@stays.com"

    def booking(name: str, sent: datetime, day: str) -> tuple[int, dict[str, str]]:
        facts = {"Ref": m.digits(5, "H"), "Nights": str(m.rng.randint(1, 6))}
        body = (
            f"Your stay at {name}, {city} is booked.\nCheck-in: {day}\nNights: {facts['Nights']}\n"
            f"Ref: {facts['Ref']}"
        )
        return m.add(sent, sender, f"Booked: {name}", body), facts

    sent = m.sent()
    day = m.day_after(sent, 5, 60)
    key, facts = booking(hotel, sent, day)
    asks = {
        "Ref": ("Booking ref for my {city} stay on {day}?", "What is the ref of my hotel in {city} on {day}?"),
        "Nights": ("How many nights is my {city} stay from {day}?", "Nights booked in {city} from {day}?"),
    }
    for label in m.some(asks):
        text = m.rng.choice(asks[label]).format(city=city, day=day)
        hop = Hop((f"stay {city}", f"{city} {day}"), (city, day), label, key)
        m.ask(f"hotel_{label.lower()}", text, facts[label], hop)
    if m.rng.random() < 0.5:  # a second stay in the same city, booked and then cancelled
        first = m.sent()
        other_day = m.day_after(first, 10, 60)
        _, other_facts = booking(other_hotel, first, other_day)
        body = (
            f"Your stay at {other_hotel}, {city} on {other_day} is cancelled.\nHotel: {other_hotel}\n"
            f"Ref: {other_facts['Ref']}"
        )
        cancel = m.add(m.sent(first, 9), sender, f"Cancelled: {other_hotel}", body)
        hop = Hop((f"cancelled {city}",), ("cancelled", city), "Hotel", cancel)
        m.ask("hotel_cancelled", f"Which hotel in {city} did I cancel?", other_hotel, hop)


def _meeting(m: Maker) -> None:
    topic = m.rng.choice(TOPICS)
    host = m.rng.choice(COLLEAGUES)
    sender = _person_address(host)
    sent = m.sent()
    day, time, room = m.day_after(sent, 1, 30), m.rng.choice(TIMES), m.rng.choice(ROOMS)
    body = f"Hi {m.first}, invite for the {topic}.\nDate: {day}\nTime: {time}\nRoom: {room}\nHost: {host}"
    key = m.add(sent, sender, f"Invite: {topic}", body)
    facts = {"Room": room, "Time": time, "Host": host}
    if m.rng.random() < 0.5:  # moved: the old slot must not be the answer any more
        moved = m.sent(sent, 10)
        new_day, new_time = m.day_after(moved, 1, 20), m.rng.choice(TIMES)
        new_room = m.rng.choice([r for r in ROOMS if r != room])
        body = f"The {topic} on {day} is moved.\nDate: {new_day}\nTime: {new_time}\nRoom: {new_room}\nHost: {host}"
        key = m.add(moved, sender, f"Moved: {topic}", body, reply_to=key)
        day, facts = new_day, {"Room": new_room, "Time": new_time, "Host": host}
    asks = {
        "Room": ("Which room is the {topic} on {day} in?", "Room for the {topic} meeting on {day}?"),
        "Time": ("What time is the {topic} on {day}?", "When on {day} does the {topic} start?"),
        "Host": ("Who is hosting the {topic} on {day}?",),
    }
    for label in m.some(asks):
        text = m.rng.choice(asks[label]).format(topic=topic, day=day)
        m.ask(f"meeting_{label.lower()}", text, facts[label], Hop((topic, f"{topic} {day}"), (topic, day), label, key))


def _money(rng: random.Random) -> str:
    cents = rng.choice((0, 0, 50, 99, rng.randint(1, 99)))
    return f"${rng.randint(40, 4800):,}.{cents:02d}"


def _invoice(m: Maker) -> None:
    vendor, domain, service = m.rng.choice(VENDORS)
    number = m.digits(4, "INV-")
    by_number = ((number,), (number,))  # keywords, match
    sent = m.sent()
    amount, due = _money(m.rng), m.day_after(sent, 14, 45)
    body = f"Invoice {number} for {service}.\nAmount: {amount}\nDue: {due}\nThanks, {vendor}"
    key = m.add(sent, f"billing@{domain}", f"Invoice {number}", body)
    text = m.rng.choice((f"When is invoice {number} due?", f"Due date of invoice {number}?"))
    m.ask("invoice_due", text, due, Hop(*by_number, "Due", key))
    if m.rng.random() < 0.5:  # corrected: the first amount must not be the answer any more
        fixed = _money(m.rng)
        body = f"Sorry, invoice {number} had an error.\nAmount: {fixed}\nThe due date is unchanged."
        fix = m.add(m.sent(sent, 12), f"billing@{domain}", f"Corrected invoice {number}", body, reply_to=key)
        text = f"What is the corrected amount of invoice {number}?"
        m.ask("invoice_corrected", text, fixed, Hop(*by_number, "Amount", fix))
    else:
        text = m.rng.choice((f"How much is invoice {number} for?", f"Amount due on invoice {number}?"))
        m.ask("invoice_amount", text, amount, Hop(*by_number, "Amount", key))


def _order(m: Maker) -> None:
    shop, domain = m.rng.choice(SHOPS)
    item = m.unique(lambda: m.rng.choice(ITEMS))
    number = m.digits(5)
    by_item, by_number = ((item,), (item,)), ((number,), (number,))  # keywords, match
    sent = m.sent()
    total = _money(m.rng)
    body = f"Thanks for your order of a {item} on {sent.date().isoformat()}.\nOrder: {number}\nTotal: {total}\n- {shop}"
    order = m.add(sent, f"orders@{domain}", f"Order {number} confirmed", body)
    shipped_at = m.sent(sent, 3)
    tracking, eta = "1Z" + m.code(8), m.day_after(shipped_at, 2, 6)
    carrier = m.rng.choice(CARRIERS)
    body = f"Your package for order {number} is on its way.\nTracking: {tracking}\nETA: {eta}"
    shipped = m.add(shipped_at, f"track@{carrier}", "Your package shipped", body)
    eta_source = shipped
    if m.rng.random() < 0.35:  # delayed: the first ETA must not be the answer any more
        late = m.sent(shipped_at, 2)
        eta = m.day_after(late, 3, 8)
        body = f"Order {number} is delayed, sorry.\nETA: {eta}"
        eta_source = m.add(late, f"track@{carrier}", "Delivery delayed", body)
    for what in m.some(("total", "eta", "tracking", "tracking_by_item")):
        if what == "total":
            text = m.rng.choice((f"What did the {item} cost?", f"Total for my {item} order?"))
            m.ask("order_total", text, total, Hop(*by_item, "Total", order))
        elif what == "eta":
            m.ask("order_eta", f"When will order {number} arrive?", eta, Hop(*by_number, "ETA", eta_source))
        elif what == "tracking":
            hop = Hop(*by_number, "Tracking", shipped)
            m.ask("order_tracking", f"Tracking number for order {number}?", tracking, hop)
        else:  # two hops: the item names the order, the order number finds the parcel
            hops = (Hop(*by_item, "Order", order), Hop(*by_number, "Tracking", shipped))
            m.ask("order_tracking_by_item", f"What is the tracking number for my {item}?", tracking, *hops)


def _dinner(m: Maker) -> None:
    friend = m.rng.choice(FRIENDS)
    sender = f"{friend.lower()}@mail.com"
    sent = m.sent()
    day, place, time = m.day_after(sent, 2, 20), m.rng.choice(RESTAURANTS), m.rng.choice(("19:00", "19:30", "20:00"))
    body = f"Hey {m.first}! Dinner on {day}?\nPlace: {place}\nTime: {time}\nSee you, {friend}"
    key = m.add(sent, sender, "Dinner?", body)
    if m.rng.random() < 0.5:  # changed: the first place must not be the answer any more
        place = m.rng.choice([r for r in RESTAURANTS if r != place])
        body = f"Change of plan for {day}, they are full.\nPlace: {place}\nSame time. {friend}"
        key = m.add(m.sent(sent, 2), sender, "Re: Dinner?", body, reply_to=key)
    text = m.rng.choice(("Where is dinner with {f} on {day}?", "Which restaurant for dinner with {f} on {day}?"))
    hop = Hop((f"dinner {friend}", f"{friend} {day}"), (friend, day), "Place", key)
    m.ask("dinner_place", text.format(f=friend, day=day), place, hop)


def _filler(m: Maker) -> None:
    """Mail with no question: noise for the search, some of it on the same words as the facts."""
    rng, sent = m.rng, m.sent()
    kind = rng.randrange(10)
    if kind == 0:
        city = rng.choice(CITIES)
        domain, _ = rng.choice(AIRLINES)
        subject = f"Fly to {city} from ${rng.randint(29, 149)}"
        body = f"Spring sale: flight deals to {city} and more. Book by {m.day_after(sent, 3, 20)}."
        m.add(sent, f"deals@{domain}", subject, body)
    elif kind == 1:
        shop, domain = rng.choice(SHOPS)
        item = rng.choice(ITEMS)
        body = f"Save {rng.choice((10, 20, 30))}% on every {item} this week at {shop}."
        m.add(sent, f"news@{domain}", f"{item.capitalize()} sale", body)
    elif kind == 2:
        topic, host = rng.choice(TOPICS), rng.choice(COLLEAGUES)
        items = rng.randint(2, 6)
        body = f"Notes from the {topic} are in the shared folder. Action items: {items}. - {host.split()[0]}"
        m.add(sent, _person_address(host), f"Notes: {topic}", body)
    elif kind == 3:  # a short thread
        friend = f"{rng.choice(FRIENDS).lower()}@mail.com"
        body = f"Hi {m.first}, lunch on Friday? {rng.choice(RESTAURANTS)} maybe?"
        first = m.add(sent, friend, "Lunch Friday?", body)
        replied = m.sent(sent, 1)
        reply = m.add(replied, m.inbox.address, "Re: Lunch Friday?", "Sounds good, noon?", reply_to=first, to=friend)
        if rng.random() < 0.5:
            m.add(m.sent(replied, 1), friend, "Re: Lunch Friday?", "Noon works. See you!", reply_to=reply)
    elif kind == 4:
        body = f"{rng.randint(3, 9)} new posts this week: AI at work, remote tips, and more."
        m.add(sent, "news@techdigest.com", "Weekly digest", body)
    elif kind == 5:
        body = f"Your password was changed on {sent.date().isoformat()}. Not you? Call IT."
        m.add(sent, "security@acme.co", "Password changed", body)
    elif kind == 6:
        host = rng.choice(COLLEAGUES)
        body = f"Hi {m.first}, do you have the latest slides? Thanks, {host.split()[0]}"
        m.add(sent, _person_address(host), "Quick question", body)
    elif kind == 7:
        vendor, domain, service = rng.choice(VENDORS)
        body = f"Thanks! We received your payment for {service}. - {vendor}"
        m.add(sent, f"billing@{domain}", "Payment received", body)
    elif kind == 8:
        friend = rng.choice(FRIENDS)
        body = f"Here are the photos from the weekend in {rng.choice(CITIES)}!"
        m.add(sent, f"{friend.lower()}@mail.com", "Photos", body)
    else:
        m.add(sent, "hr@acme.co", "Reminder", f"Please submit your timesheet by {m.day_after(sent, 1, 5)}.")


# Every kind of event an inbox's plan holds, filler included.
MAKERS: dict[str, Callable[[Maker], None]] = {
    "flight": _flight, "hotel": _hotel, "meeting": _meeting, "invoice": _invoice, "order": _order, "dinner": _dinner,
    "filler": _filler,
}  # fmt: skip

