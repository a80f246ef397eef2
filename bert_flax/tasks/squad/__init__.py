"""Extractive question answering (SQuAD v1.1 / v2.0): the files, their windows, answers from
logits and the official exact-match and F1 scores (docs/training.md, "Question answering: SQuAD
files and scores")."""
