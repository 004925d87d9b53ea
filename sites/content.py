"""Deterministic site content: everything the bundled sites show derives from one seed.

The same seed gives the same catalogue, cities, flights, articles and mailbox, so task generators
(which read the same content) produce tasks whose answers the sites really contain.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from functools import cached_property

from warehouse.ids import stable_hash

_SYL = [
    "ka",
    "lo",
    "mi",
    "ra",
    "ven",
    "dor",
    "sel",
    "tan",
    "bri",
    "o",
    "na",
    "sul",
    "tor",
    "vi",
    "el",
    "mar",
    "zu",
    "pe",
    "lin",
    "gor",
    "as",
    "ha",
    "ri",
    "del",
]
CATEGORIES = ["Kitchen", "Lighting", "Bags", "Outdoor", "Office", "Audio", "Garden", "Toys"]
_NOUNS = {
    "Kitchen": ["Mug", "Kettle", "Teapot", "Skillet", "Knife Set", "Cutting Board"],
    "Lighting": ["Desk Lamp", "Floor Lamp", "Lantern", "String Lights", "Reading Light"],
    "Bags": ["Backpack", "Tote", "Duffel", "Messenger Bag", "Sling Bag"],
    "Outdoor": ["Tent", "Sleeping Bag", "Camp Chair", "Water Bottle", "Hammock"],
    "Office": ["Notebook", "Desk Organizer", "Monitor Stand", "Pen Set", "Stapler"],
    "Audio": ["Headphones", "Speaker", "Earbuds", "Radio", "Soundbar"],
    "Garden": ["Watering Can", "Planter", "Pruner", "Garden Hose", "Seed Kit"],
    "Toys": ["Puzzle", "Kite", "Building Set", "Plush Bear", "Yo-yo"],
}
BRANDS = [
    "Nordvik",
    "Alder & Co",
    "Pinecrest",
    "Lumo",
    "Brightwell",
    "Solace",
    "Kestrel",
    "Orrin",
    "Tidewell",
    "Marlowe",
]
COLORS = ["Black", "White", "Red", "Blue", "Green", "Grey", "Yellow"]
SIZES = ["S", "M", "L", "XL"]
AIRLINES = ["Aurora Air", "Skyline", "BlueJet", "Nimbus", "Polar Wings", "Sunway"]
COUNTRIES = ["Norland", "Estavia", "Marivel", "Kordania", "Solmere", "Veyland"]
FIRST = [
    "Ada",
    "Grace",
    "Linus",
    "Barbara",
    "Alan",
    "Edsger",
    "Frances",
    "Ken",
    "Radia",
    "Donald",
    "Margaret",
    "John",
    "Hedy",
    "Tim",
]
LAST = [
    "Lovelace",
    "Hopper",
    "Torvalds",
    "Liskov",
    "Turing",
    "Dijkstra",
    "Allen",
    "Thompson",
    "Perlman",
    "Knuth",
    "Hamilton",
    "Backus",
    "Lamarr",
    "Berners",
]
TOPICS = [
    "quarterly report",
    "team offsite",
    "budget review",
    "design review",
    "release plan",
    "hiring update",
    "server migration",
    "customer feedback",
    "conference trip",
    "security audit",
    "onboarding",
    "roadmap",
]


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYL) for _ in range(parts)).capitalize()


@dataclass(frozen=True)
class Product:
    pid: str
    name: str
    category: str
    brand: str
    price: float
    rating: float
    n_reviews: int
    colors: tuple[str, ...]
    sizes: tuple[str, ...]
    description: str


@dataclass(frozen=True)
class City:
    code: str
    name: str
    country: str


@dataclass(frozen=True)
class Flight:
    fid: str
    origin: str
    dest: str
    date: str
    airline: str
    depart: str
    arrive: str
    duration_min: int
    stops: int
    price: int


@dataclass(frozen=True)
class Article:
    slug: str
    title: str
    country: str
    population: int
    founded: int
    area_km2: int
    mayor: str
    twin: str  # slug of the twin city
    river: str
    paragraphs: tuple[str, ...]


@dataclass(frozen=True)
class Message:
    mid: str
    sender_name: str
    sender: str
    subject: str
    body: str
    date: str
    folder: str = "inbox"


@dataclass
class Content:
    """All generated content of one seed."""

    seed: int
    products: list[Product] = field(default_factory=list)
    cities: list[City] = field(default_factory=list)
    articles: list[Article] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    today: dt.date = dt.date(2026, 6, 1)

    @cached_property
    def product_by_id(self) -> dict[str, Product]:
        return {p.pid: p for p in self.products}

    @cached_property
    def article_by_slug(self) -> dict[str, Article]:
        return {a.slug: a for a in self.articles}

    @cached_property
    def city_by_code(self) -> dict[str, City]:
        return {c.code: c for c in self.cities}

    @cached_property
    def message_by_id(self) -> dict[str, Message]:
        return {m.mid: m for m in self.messages}

    def flights(self, origin: str, dest: str, date: str) -> list[Flight]:
        """The flights of a route on a date (deterministic; empty for unknown cities)."""
        if origin not in self.city_by_code or dest not in self.city_by_code or origin == dest:
            return []
        rng = random.Random(stable_hash(self.seed, origin, dest, date))
        out = []
        for i in range(rng.randint(6, 10)):
            dep = rng.randrange(5 * 60, 22 * 60, 5)
            dur = rng.randrange(60, 600, 5)
            stops = rng.choice([0, 0, 1, 1, 2])
            arr = (dep + dur) % (24 * 60)
            out.append(
                Flight(
                    fid=f"{origin}{dest}{date.replace('-', '')}{i:02d}",
                    origin=origin,
                    dest=dest,
                    date=date,
                    airline=rng.choice(AIRLINES),
                    depart=f"{dep // 60:02d}:{dep % 60:02d}",
                    arrive=f"{arr // 60:02d}:{arr % 60:02d}",
                    duration_min=dur,
                    stops=stops,
                    price=rng.randrange(49, 900),
                )
            )
        prices = [f.price for f in out]
        if len(set(prices)) != len(prices):  # unique prices: "the cheapest" is unambiguous
            out = [
                f.__class__(**{**f.__dict__, "price": f.price * 10 + i}) for i, f in enumerate(out)
            ]
        return out

    def flight(self, fid: str) -> Flight | None:
        if len(fid) < 16:
            return None
        origin, dest, d = fid[:3], fid[3:6], fid[6:14]
        date = f"{d[:4]}-{d[4:6]}-{d[6:8]}"
        return next((f for f in self.flights(origin, dest, date) if f.fid == fid), None)


def generate(seed: int = 0) -> Content:
    """Generate the content of all bundled sites for ``seed``."""
    rng = random.Random(f"webloop-sites-{seed}")
    c = Content(seed=seed)
    _products(c, rng)
    _cities(c, rng)
    _articles(c, rng)
    _messages(c, rng)
    return c


def _products(c: Content, rng: random.Random) -> None:
    seen = set()
    while len(c.products) < 160:
        cat = rng.choice(CATEGORIES)
        brand = rng.choice(BRANDS)
        noun = rng.choice(_NOUNS[cat])
        adj = rng.choice(["Classic", "Compact", "Deluxe", "Eco", "Pro", "Mini", "Urban", "Vintage"])
        name = f"{brand} {adj} {noun}"
        if name in seen:
            continue
        seen.add(name)
        i = len(c.products)
        c.products.append(
            Product(
                pid=f"p{i:04d}",
                name=name,
                category=cat,
                brand=brand,
                price=round(rng.uniform(4, 300), 2) + i / 10000,  # unique prices
                rating=round(rng.uniform(2.5, 5.0), 1),
                n_reviews=rng.randint(3, 40),
                colors=tuple(sorted(rng.sample(COLORS, rng.randint(1, 4)))),
                sizes=tuple(s for s in SIZES if rng.random() < 0.5)
                if cat in ("Bags", "Outdoor")
                else (),
                description=f"The {name.lower()} is a {adj.lower()} {noun.lower()} from {brand}, "
                f"made for everyday use.",
            )
        )
    c.products = [p.__class__(**{**p.__dict__, "price": round(p.price, 2)}) for p in c.products]


def _cities(c: Content, rng: random.Random) -> None:
    codes = set()
    while len(c.cities) < 24:
        name = _name(rng, rng.randint(2, 3))
        code = name[:3].upper()
        if code in codes:
            continue
        codes.add(code)
        c.cities.append(City(code=code, name=name, country=rng.choice(COUNTRIES)))


def _articles(c: Content, rng: random.Random) -> None:
    names = []
    while len(names) < 60:
        n = _name(rng, rng.randint(2, 3)) + rng.choice(["", "burg", "ton", "ia", "ville", "stad"])
        if n not in names:
            names.append(n)
    slugs = [n.lower() for n in names]
    for i, n in enumerate(names):
        twin = slugs[(i * 7 + 3) % len(slugs)]
        if twin == slugs[i]:
            twin = slugs[(i + 1) % len(slugs)]
        country, river = rng.choice(COUNTRIES), _name(rng, 2) + " River"
        pop, founded = rng.randrange(5_000, 3_000_000), rng.randrange(800, 1950)
        mayor = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        other = [slugs[rng.randrange(len(slugs))] for _ in range(3)]
        paras = (
            f"{n} is a city in {country} on the banks of the {river}. It was founded in "
            f"{founded} and is twinned with [[{twin}]].",
            f"The economy of {n} rests on trade with [[{other[0]}]] and [[{other[1]}]]; its "
            f"old town is a popular destination.",
            f"The current mayor is {mayor}. Nearby cities include [[{other[2]}]].",
        )
        c.articles.append(
            Article(
                slug=slugs[i],
                title=n,
                country=country,
                population=pop,
                founded=founded,
                area_km2=rng.randrange(20, 900),
                mayor=mayor,
                twin=twin,
                river=river,
                paragraphs=paras,
            )
        )


def _messages(c: Content, rng: random.Random) -> None:
    people = [(f, l_) for f in FIRST for l_ in LAST]
    rng.shuffle(people)
    for i in range(36):
        first, last = people[i % 14]
        topic = rng.choice(TOPICS)
        day = c.today - dt.timedelta(days=i // 3)
        c.messages.append(
            Message(
                mid=f"m{i:03d}",
                sender_name=f"{first} {last}",
                sender=f"{first.lower()}.{last.lower()}@example.org",
                subject=f"{topic.capitalize()} #{rng.randrange(10, 99)}",
                body=f"Hi,\n\nquick note about the {topic}: the meeting code is "
                f"{rng.randrange(1000, 9999)}. Let me know what you think.\n\n{first}",
                date=day.isoformat(),
            )
        )
