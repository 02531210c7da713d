"""Varied prompts for real-model exactness tests (written for these tests, not from any benchmark)."""

REAL_PROMPTS = [
    "Write a short poem about the sea at night.",
    "Explain in simple terms how a refrigerator keeps food cold.",
    "Repeat this list back to me in reverse order: apple, banana, cherry, date, elderberry, fig.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarise: The city council met on Tuesday to discuss the new bicycle lanes. Residents praised the lanes "
    "for safety, while shop owners worried about parking. The council voted to extend the lanes next spring.",
    "What are three tips for learning a new language?",
    "Translate to French: The weather is nice today, so we are going to the park.",
    "Continue the story: The robot opened the door and saw",
    "List the planets of the solar system in order from the sun.",
    "Fix the bug in this code: def add(a, b): return a - b",
    "Give me a recipe for pancakes with exact quantities.",
    "Why is the sky blue? Answer in two sentences.",
]
