"""A small fictional corpus: facts the model cannot know, so answers must come from the context."""

from __future__ import annotations

from llama_index.core import Document

PASSAGES = {
    "Vellmar Observatory": (
        "The Vellmar Observatory stands on the basalt cliffs of Kessa Point, three hours north of the "
        "harbour town of Orlen. It was founded in 1887 by the astronomer Ida Marrow, who paid for the "
        "first telescope by selling her family's salt mine. The main instrument is a 90-centimetre "
        "refractor called the Long Eye, which was ground by hand over six winters. Every autumn the "
        "observatory opens its dome to the public for the Night of Lanterns, when visitors carry paper "
        "lamps up the cliff path. The current director, Tomas Feld, studies variable stars in the "
        "constellation of the Heron. Because sea fog covers the cliffs for most of the summer, the "
        "observing season runs from October to March."
    ),
    "Orrin Guild": (
        "The Orrin Guild is a cooperative of glassblowers in the valley town of Brask. Its members are "
        "best known for cobalt-blue bottles, which they export mainly to the coastal cities of the south. "
        "The guild was formed in 1923 after a flood destroyed the old furnaces along the river Tane, and "
        "the surviving workshops agreed to share one large kiln on higher ground. Apprentices train for "
        "seven years and must present a 'proof vase' to the guild council before they may sign their "
        "work. The guild's emblem is a heron holding a glass bead. Each spring, Brask hosts the Furnace "
        "Fair, where the guild sells seconds and chipped pieces at half price."
    ),
    "Tane River ferry": (
        "The Tane River ferry connects Brask to the village of Millhaven on the far bank. The ferry is "
        "pulled along a steel cable by a diesel winch, so it cannot drift even in the spring floods. "
        "A crossing takes eleven minutes and costs two copper marks for a person or six for a cart. "
        "The ferry has been operated by the Dunmore family since 1951; the present ferrymaster, "
        "Agnes Dunmore, is the third generation to run it. The boat itself is named the Patient Gull. "
        "In winter the ferry stops at dusk, because ice on the cable makes night crossings unsafe. "
        "Plans for a bridge have been debated for decades but never funded."
    ),
    "Kessa Point lighthouse": (
        "The lighthouse at Kessa Point was built in 1862 to warn ships away from the Needle Rocks. It "
        "is a white stone tower forty-one metres tall with a red lantern room. Its lamp flashes twice "
        "every fifteen seconds and can be seen for twenty-two nautical miles in clear weather. The last "
        "resident keeper, Oskar Brand, left in 1979 when the light was automated. Today the keeper's "
        "cottage is a small museum about shipwrecks, including the wreck of the schooner Margit, which "
        "sank in a storm in 1894 with a cargo of oranges. The museum is open on weekends from May to "
        "September."
    ),
    "Orlen harbour market": (
        "The harbour market in Orlen is held every Thursday on the stone quay beside the fish hall. "
        "Farmers from the inland hills sell goat cheese, smoked eels and dark rye bread. The market's "
        "oldest stall belongs to the Hask family, who have sold pickled herring there since 1901. A "
        "brass bell hung from the harbour crane opens the market at seven in the morning and closes it "
        "at one in the afternoon. In bad weather the market moves inside the fish hall, where the smell "
        "is famously strong. The town council charges each stall a fee of four copper marks per day."
    ),
}

DOCUMENTS = [Document(text=text, metadata={"title": title}, doc_id=title) for title, text in PASSAGES.items()]

QUESTIONS = [
    "Who founded the Vellmar Observatory, and how was its first telescope paid for?",
    "What does the Orrin Guild export, and where do apprentices present their proof vase?",
    "How long does the Tane River ferry crossing take and who runs the ferry?",
]
