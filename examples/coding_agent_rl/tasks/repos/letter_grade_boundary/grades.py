CUTOFFS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


def letter_grade(score):
    for cutoff, letter in CUTOFFS:
        if score > cutoff:
            return letter
    return "F"
