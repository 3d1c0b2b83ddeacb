"""A small fictional-fact lookup set for the real-model tests (facts the model cannot know)."""

FILLER = (
    "Visitors often remark on the narrow streets, the slate roofs and the smell of bread in the "
    "early morning. The local council publishes a short newsletter every season, and most "
    "families have lived in the area for several generations. "
)

FACTS = [
    ("Brannock", "The lighthouse of Brannock was painted {v} in 1904.", "What colour was the lighthouse of Brannock painted?", "green"),
    ("Quillmere", "The mayor of Quillmere is a retired sailor named {v}.", "What is the name of the mayor of Quillmere?", "Odile Farrant"),
    ("Tessaly Vale", "The only bridge in Tessaly Vale has {v} arches.", "How many arches does the bridge in Tessaly Vale have?", "seven"),
    ("Dunmarrow", "The market in Dunmarrow is famous for selling {v}.", "What is the market in Dunmarrow famous for selling?", "blue cheese"),
    ("Korrin Bay", "Fishermen of Korrin Bay mostly catch {v}.", "What do the fishermen of Korrin Bay mostly catch?", "mackerel"),
    ("Ashgrove", "The school in Ashgrove was founded by {v}.", "Who founded the school in Ashgrove?", "Helena Brisk"),
    ("Pellworth", "The river through Pellworth is called the {v}.", "What is the river through Pellworth called?", "Sorrel"),
    ("Vantmoor", "The clock tower of Vantmoor is {v} metres tall.", "How tall is the clock tower of Vantmoor?", "forty"),
    ("Ellisford", "The yearly fair in Ellisford takes place in {v}.", "In which month is the yearly fair in Ellisford?", "November"),
    ("Carrowdale", "The church bell of Carrowdale was cast in the city of {v}.", "In which city was the church bell of Carrowdale cast?", "Ghent"),
    ("Minsk Hollow", "The baker of Minsk Hollow is known for a pie made with {v}.", "What is the pie of the baker of Minsk Hollow made with?", "rhubarb"),
    ("Orlen Cross", "The train station of Orlen Cross opened in the year {v}.", "In which year did the train station of Orlen Cross open?", "1887"),
]


def passage(index: int) -> str:
    place, template, _, value = FACTS[index]
    return f"{place} is a small town. {FILLER}{template.format(v=value)} {FILLER}"


def question(index: int) -> tuple[str, str]:
    _, _, q, a = FACTS[index]
    return q, a
