"""The fictional world's word tables: syllables of invented names, name forms, kinds, regions,
filler sentences."""

from __future__ import annotations

_ONSETS = "b d f g k l m n p r s t v z th br dr kr tr vr sk gr kh q ch".split()
_VOWELS = "a e i o u ae ei ou y ia".split()
_CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m", "nd", "rk", "sh", "v"]
_COUNTRY_SUFFIX = ["ia", "ar", "and", "esh", "ovia", "eth", "oria", "ain"]
_CITY_FORMS = ["{}", "{}", "{}", "{}mor", "{}hold", "{}ra", "Port {}", "New {}",
               "{} Vale", "{} Falls"]
_ORG_KINDS = ["Company", "Institute", "Guild", "Bank", "Press", "Observatory", "Trading Company",
              "Society", "Shipyards", "Railway", "Conservatory", "Mining Company"]
_WORK_NOUNS = ["Lantern", "Chronicle", "Atlas", "Sonata", "Letters", "Garden", "Tides", "Mirror",
               "Ledger", "Orchard", "Compass", "Harvest", "Archive", "Crossing", "Bell"]
_GENRES = ["novel", "collection of poems", "treatise", "play", "travel memoir", "historical study",
           "short story collection", "essay"]
_OCCUPATIONS = ["cartographer", "engineer", "botanist", "painter", "merchant", "physician",
                "architect", "astronomer", "composer", "jurist", "chemist", "sculptor", "historian",
                "shipwright", "linguist", "banker", "printer", "surveyor"]
_REGIONS = ["northern archipelago", "eastern steppe", "western highlands", "southern coast",
            "central plateau", "inner sea basin", "river delta lowlands"]

_FILLER = {
    "person": ["{S} received an early education from private tutors.",
               "Contemporaries described {o} as patient, exacting and fond of long walks.",
               "In later years {s} travelled widely, spending several seasons in {city2}.",
               "{S} corresponded for decades with {person2}.",
               "A portrait of {o} hangs in the municipal gallery of {city2}.",
               "{S} kept detailed diaries that survive in a private collection.",
               "Several of {p} letters were published after {p} death.",
               "{S} was elected to a learned society at a young age."],
    "city": ["The old town is known for its narrow streets and covered markets.",
             "The city hosts a well-attended autumn fair.",
             "Its harbour and warehouses grew rapidly during the nineteenth century.",
             "A stone bridge connects the two halves of the old quarter.",
             "The surrounding farmland produces grain, wool and orchard fruit.",
             "Travellers often compare it with {city2}.",
             "A tramway links the centre with the outer districts."],
    "country": ["The country is divided into provinces, each with its own assembly.",
                "Its economy rests on farming, fishing and river trade.",
                "The climate is mild near the coast and harsher inland.",
                "The national flag shows three horizontal bands.",
                "Its parliament meets in spring and autumn sessions.",
                "The country maintains close trading ties with {country2}."],
    "org": ["It employs several hundred people.",
            "Its archives are open to researchers by appointment.",
            "The organisation survived two financial crises.",
            "It later opened a branch office in {city2}.",
            "Its annual report is widely read in the region.",
            "A rival firm was established in {city2} a few years later."],
    "work": ["Critics praised its careful structure and plain style.",
             "It was translated into several languages.",
             "The first edition was printed in a small run.",
             "It is often compared with {work2}.",
             "A revised edition appeared some years later.",
             "Scholars still debate the identity of its dedicatee."],
}
