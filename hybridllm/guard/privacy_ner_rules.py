"""The context rules of the language-aware privacy layer (`hybridllm.guard.privacy_ner`), in plain
Python: what spaCy's NER models do not label, found by a context word next to a value.

- `date_of_birth`: a date (numeric, or with a month name in English, French, German or Spanish)
  shortly after "born", "DOB", "date of birth", "né(e) le", "date de naissance", "geboren",
  "fecha de nacimiento"...
- `passport`: a 6-12 character number (3+ digits) shortly after "passport", "passeport",
  "Reisepass", "pasaporte".
- `national_id`: a number (5+ digits) shortly after an ID's name ("ID card", "carte
  d'identité", "numéro de sécurité sociale", "Personalausweis", "DNI", "driver's licence",
  "tax ID"...), and a French social security number (NIR) anywhere when its key checks.
- `address`: a house number with a street type ("42 Baker Street", "4821 Copper Creek Trl",
  "12 rue de la Paix", "Hauptstraße 5", "Calle Mayor 10"). The English and French street types
  come from postal standards shipped as data (`privacy_streets`: USPS Publication 28 C1, Royal
  Mail's thoroughfare descriptors, AFNOR XP Z10-011); the German and Spanish ones are a short
  list of our own.

`detect_languages` picks the pipelines a text needs by counting common function words (about
0.1 ms for 2,000 tokens); `named_alone` says whether a one-word person name has a naming cue
before it ("my name is", "je m'appelle", "Mr."), which the layer asks of one-word names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hybridllm.guard.privacy_streets import french_street_types, street_types

_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|"
    "janvier|février|fevrier|mars|avril|mai|juin|juillet|août|aout|septembre|octobre|novembre|"
    "décembre|decembre|januar|jänner|februar|märz|maerz|juni|juli|oktober|dezember|"
    "enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|octubre|noviembre|"
    "diciembre"
)
_DATE = (
    r"(?:\d{1,2}[./-]\d{1,2}[./-](?:\d{4}|\d{2})(?!\d)"
    r"|\d{4}-\d{2}-\d{2}"
    rf"|(?:the )?\d{{1,2}}(?:st|nd|rd|th|er)?\.?(?: of| de)? (?:{_MONTHS})\.?"
    r"(?: de| del)?,? \d{4}"
    rf"|(?:{_MONTHS})\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}})"
)
_DOB_CUES = (
    r"born|birth ?date|date of birth|birthday|d\.?o\.?b\.?|"
    r"née?s?|naissance|date de naissance|anniversaire|"
    r"geboren|geburtsdatum|geburtstag|geb\.|"
    r"nacid[oa]s?|nací|naci|fecha de nacimiento|cumpleaños"
)
DOB = re.compile(rf"(?i)(?<![\w])(?:{_DOB_CUES})(?![\w])[^\n\d]{{0,30}}?(?P<v>{_DATE})")
DOB_BEFORE = re.compile(
    rf"(?i)(?<![\w\d])(?P<v>{_DATE})[^\n\d]{{0,12}}?(?<![\w])(?:geboren|born)(?![\w])"
)

_PASSPORT_CUES = r"passports?|passeports?|reisepass(?:nummer)?|passnummer|pasaportes?"
PASSPORT = re.compile(
    rf"(?<![\w])(?i:{_PASSPORT_CUES})(?![\w])[^\n\d]{{0,30}}?"
    r"(?P<v>(?<![\w-])(?=(?:[A-Z ]*\d){3})[A-Z0-9]{2,12}(?: [A-Z0-9]{2,10})?(?![\w-]))"
)

_ID_CUES = (
    r"national id(?:entity)?(?: card)?|id(?:entity)? card|id number|identity number|"
    r"personal id|citizen id|tax id|tin|tax number|tax file number|"
    r"social security|social insurance|national insurance|sin|medicare|health insurance|nhs|"
    r"driver'?s? licen[cs]e|driving licen[cs]e|licen[cs]e number|"
    r"carte d'identité|carte nationale d'identité|cni|pièce d'identité|"
    r"sécurité sociale|securite sociale|numéro de sécu|numéro fiscal|nir|"
    r"permis de conduire|numéro de permis|carte vitale|"
    r"personalausweis(?:nummer)?|ausweisnummer|ausweis|steuer-?id|steueridentifikationsnummer|"
    r"steuernummer|sozialversicherungsnummer|führerschein(?:nummer)?|"
    r"dni|nie|nif|documento nacional de identidad|número de la seguridad social|"
    r"número de identidad|seguridad social|carnet de conducir"
)
NATIONAL_ID = re.compile(
    rf"(?<![\w])(?i:{_ID_CUES})(?![\w])[^\n\d]{{0,30}}?"
    r"(?P<v>(?<![\w-])[A-Z]{0,5}\d(?:[ .-]?[\dA-Z]){4,22}(?![\w-]))"
)
# a French NIR: sex, year, month, department (2A/2B in Corsica), commune, order, key (97 - n % 97)
NIR = re.compile(
    r"(?<![\w])(?P<v>[12] ?\d{2} ?(?:0[1-9]|1[0-2]|[2-9]\d) ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2})"
    r"(?![\w])"
)

_NUM = r"\d{1,5}(?: ?(?:bis|ter|[A-Ha-h]))?"
_CAP = r"[A-ZÀ-Ý][\w'’.-]+"
_EN_STREET = street_types()  # USPS Publication 28 C1 and UK descriptors (`privacy_streets`)
_FR_STREET = french_street_types()  # AFNOR XP Z10-011 types de voie
_ES_STREET = r"calle|c/|avenida|avda\.?|plaza|paseo|camino|carrera|carretera|ronda|travesía"
_DE_SUFFIX = r"straße|strasse|str\.|weg|platz|allee|gasse|ring|damm|ufer|chaussee"
ADDRESS = re.compile(
    # 42 Baker Street / 1600 Pennsylvania Ave / 310 West 72nd Street
    rf"(?<![\w.,-]){_NUM},? (?:(?:{_CAP}|\d{{1,3}}(?:st|nd|rd|th)) ){{1,4}}"
    rf"(?:{_EN_STREET})\.?(?![\w])"
    # 12 rue de la Paix / 5 bis, avenue Victor Hugo
    rf"|(?<![\w.,-]){_NUM},? (?:{_FR_STREET})\.? (?:(?:de la|de l'|du|des|de|d'|l'|la|le) ?)?{_CAP}"
    # Hauptstraße 5 / Berliner Str. 12a / Am Weiher Weg 3
    rf"|(?<![\w])[A-ZÄÖÜ][\wäöüß-]*(?i:{_DE_SUFFIX})(?: \d{{1,4}}[a-z]?)(?![\w])"
    rf"|(?<![\w])(?:{_CAP} ){{1,2}}(?:Straße|Strasse|Str\.|Weg|Platz|Allee|Gasse) \d{{1,4}}[a-z]?"
    # Calle Mayor 10 / Avenida de la Constitución, 25
    rf"|(?<![\w])(?i:{_ES_STREET}) (?:(?:de la|del|de) )?{_CAP}(?: {_CAP}){{0,3}},? "
    r"(?:n[º°o]\.? ?)?\d{1,4}(?![\w])"
)


# a strong naming cue and the words after it: "my name is kevin stuart", "Nom : Faure"
_NAME_CUES = (
    r"my name is|my name's|my full name is|name ?:|full name ?:|je m'appelle|mon nom est|"
    r"nom ?:|prénom ?:|ich heiße|ich heisse|mein name ist|me llamo|mi nombre es|nombre ?:"
)
NAMED = re.compile(
    rf"(?<![\w])(?i:{_NAME_CUES}) *(?P<v>[^\W\d_][\w'’-]+(?: [A-Z][\w'’-]+| (?!and |et |und |y )"
    r"[a-z][\w'’-]+(?= *[,.;]| +(?:and|et|und|y) ))?)"
)


# a relation the user names a private person by: "my colleague", "ma voisine", "mein Nachbar",
# "mi jefa", "mia sorella" (the words after it are a private person's name)
RELATION = (
    r"my (?:wife|husband|son|daughter|mother|father|mom|mum|dad|brother|sister|friend|"
    r"colleague|co-?worker|boss|manager|neighbou?r|partner|doctor|patient|client|tenant|"
    r"landlord|landlady|cousin|aunt|uncle|niece|nephew|grandmother|grandfather|grandma|grandpa|"
    r"girlfriend|boyfriend|fianc[ée]e?|flatmate|roommate|teacher|student|employee|assistant)|"
    r"mon (?:mari|fils|père|frère|ami|copain|collègue|voisin|patron|chef|médecin|patient|"
    r"client|locataire|propriétaire|cousin|oncle|neveu|fiancé|colocataire)|"
    r"ma (?:femme|fille|mère|sœur|soeur|amie|copine|collègue|voisine|patronne|cheffe|patiente|"
    r"cliente|locataire|propriétaire|cousine|tante|nièce|fiancée|colocataire)|"
    r"mein(?:em|en)? (?:mann|sohn|vater|bruder|freund|kollegen?|nachbarn?|chef|arzt|patienten?|"
    r"kunden?|mieter|vermieter|cousin|onkel|neffen?|opa|großvater|verlobter|mitbewohner|lehrer)|"
    r"meine[rm]? (?:frau|tochter|mutter|schwester|freundin|kollegin|nachbarin|chefin|ärztin|"
    r"patientin|kundin|mieterin|vermieterin|cousine|tante|nichte|oma|großmutter|verlobte|"
    r"mitbewohnerin|lehrerin)|"
    r"mi (?:marido|esposo|esposa|mujer|hijo|hija|padre|madre|hermano|hermana|amigo|amiga|"
    r"compañero|compañera|colega|jefe|jefa|vecino|vecina|médico|médica|paciente|cliente|"
    r"inquilino|inquilina|casero|casera|primo|prima|tío|tía|abuelo|abuela|novio|novia)|"
    r"mio (?:marito|figlio|padre|fratello|amico|collega|capo|vicino|medico|paziente|cliente|"
    r"inquilino|cugino|zio|nonno|fidanzato)|"
    r"mia (?:moglie|figlia|madre|sorella|amica|collega|vicina|paziente|cliente|inquilina|"
    r"cugina|zia|nonna|fidanzata)"
)
_NAMING_CUE = re.compile(
    r"(?i)(?<![\w'])(?:my name is|name is|name:|i am|i'm|called|named|"
    r"mr\.?|mrs\.?|ms\.?|miss|dr\.?|prof\.?|sir|madam|dear|hi|hello|"
    r"je m'appelle|je suis|nom ?:|prénom ?:|m\.|mme|mlle|monsieur|madame|cher|chère|bonjour|"
    rf"ich heiße|ich bin|herr|frau|me llamo|soy|señor|señora|sr\.|sra\.|{RELATION})\W{{0,3}}$"
)
# one to three capitalised words right after a relation: a private person's name, whether or
# not the NER model knows it ("My colleague Deepa Raghunathan keeps...")
_NAME_WORD = r"[A-ZÀ-ÖØ-Þ][\w'’-]+"
RELATED = re.compile(
    rf"(?<![\w])(?i:{RELATION}),? (?P<v>{_NAME_WORD}(?: {_NAME_WORD}){{0,2}})(?![\w'’-])"
)


def nir_ok(value: str) -> bool:
    """A French social security number (15 characters without spaces): key = 97 - n % 97, with
    Corsica's 2A / 2B counted as 19 / 18."""
    v = value.replace(" ", "")
    if len(v) != 15:
        return False
    body = v[:13].replace("2A", "19").replace("2B", "18")
    if not body.isdigit() or not v[13:].isdigit():
        return False
    return 97 - int(body) % 97 == int(v[13:])


def _digits(n: int) -> Callable[[str], bool]:
    def enough(value: str) -> bool:
        return sum(ch.isdigit() for ch in value) >= n

    return enough


@dataclass(frozen=True, slots=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] = lambda value: True


RULES: tuple[Rule, ...] = (
    Rule("date_of_birth", DOB),
    Rule("date_of_birth", DOB_BEFORE),
    Rule("person", NAMED),
    Rule("person", RELATED),
    Rule("passport", PASSPORT, _digits(3)),
    Rule("national_id", NATIONAL_ID, _digits(5)),
    Rule("national_id", NIR, nir_ok),
    Rule("address", ADDRESS),
)


def find(text: str) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) of every value the context rules find in `text`."""
    for rule in RULES:
        for m in rule.pattern.finditer(text):
            span = m.span("v") if "v" in rule.pattern.groupindex else m.span()
            value = text[span[0] : span[1]]
            if rule.valid(value):
                yield rule.kind, span[0], span[1]


# ---- language ----------------------------------------------------------------------------------

_WORDS = re.compile(r"[a-zà-ÿ']+")
_EN = frozenset(
    "the and is are was were of to in my i you your with for on at this that it be have has "
    "what how who when where which from by an a not do does can will would should".split()
)
_FR = frozenset(
    "le la les des du de et est sont je tu vous mon ma mes ton ta nous il elle un une pour dans "
    "sur avec pas que qui ce cette au aux où ou mais suis j'ai c'est m'appelle né née habite "
    "l' d' j' c' n' qu' s'il".split()
)


def detect_languages(text: str, languages: tuple[str, ...] = ("en", "fr")) -> tuple[str, ...]:
    """The pipelines to run on `text`: the one language whose function words clearly dominate
    (3 to 2 or more, and at least 2 of them), else every language in `languages` (short, mixed
    or other-language text is read by each)."""
    en = fr = 0
    for word in _WORDS.findall(text.lower()):
        if word in _EN:
            en += 1
        if word in _FR or word[:2] in ("l'", "d'", "j'", "c'", "n'", "m'"):
            fr += 1
    if "en" in languages and en >= 2 and en * 2 >= fr * 3:
        return ("en",)
    if "fr" in languages and fr >= 2 and fr * 2 >= en * 3:
        return ("fr",)
    return languages


_DE = frozenset(
    "der die das den dem des und ist sind nicht ein eine einen einem im ich mein meine wir sie "
    "er es was wie wer wann wo welche welcher welches hat haben bei mit von für auf zu aus über "
    "auch noch nach vor seine seiner ihre ihrer als warum wieso weshalb dass sich wird wurde oder "
    "aber wenn kann gibt".split()
)
# endings of German nouns that no given name or surname of ours has ("Einigung", "Freiheit",
# "Wissenschaft", "Deutschlands"): in German text, where every noun is capitalised, such a word
# is not a name word
_DE_ENDS = tuple(
    "ung ungen ungs heit heits keit keits schaft tion ität ismus nis tum lands reich".split()
)


def german(text: str) -> bool:
    """Whether German function words clearly dominate `text` (as `detect_languages` reads
    English and French)."""
    words = _WORDS.findall(text.lower())
    de = sum(w in _DE for w in words)
    en = sum(w in _EN for w in words)
    fr = sum(w in _FR for w in words)
    return de >= 2 and de * 2 >= max(en, fr) * 3


def name_words(span: str, german_text: bool) -> int:
    """The capitalised words of a person entity that may be name words: all of them, but in
    German text none that is a function word ("Welche") or ends as German nouns do."""
    words = [w.strip(".,;:!?\"'()") for w in span.split()]
    caps = [w for w in words if w[:1].isupper()]
    if german_text:
        caps = [w for w in caps if w.lower() not in _DE and not w.lower().endswith(_DE_ENDS)]
    return len(caps)


def named_alone(text: str, start: int) -> bool:
    """A naming cue stands right before `start` ("my name is X", "Mme X", "mon voisin X")."""
    return _NAMING_CUE.search(text[max(0, start - 40) : start].rstrip()) is not None
