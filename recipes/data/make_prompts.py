"""Write templated code and math prompts for the CPU recipes' training data.

The long CPU recipes are short of data, not capacity: on their own training rows the draft
reaches 0.86 alpha, on held-out rows 0.50 (eval/results/notes/2026-11-30-fkl-vs-ce-cpu.md).
These prompts add contexts (``fkl_topk_cpu_more_prompts.yaml``). The target answers them
(data.regime: target), so only the questions are written here; they are train-only sources
(``heldout: false``), so the held-out split stays the hand-written prompts and no templated
prompt is scored.

    python recipes/data/make_prompts.py            # rewrites the two *_templated.jsonl files

Deterministic (one seed); prompts already in the other prompt files or the eval suites are
skipped.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from draftkit.io import atomic_write_text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# (function name, what it does); the name is shown in some phrasings only.
TASKS = [
    ("sum_odd", "returns the sum of the odd numbers in a list"),
    ("count_words", "counts the words in a sentence"),
    ("reverse_words", "reverses the order of the words in a sentence"),
    ("is_prime", "checks whether a number is prime"),
    ("factorial", "returns the factorial of n"),
    ("gcd", "returns the greatest common divisor of two integers"),
    ("lcm", "returns the least common multiple of two integers"),
    ("flatten", "flattens a list of lists into one list"),
    ("chunk", "splits a list into chunks of size n"),
    ("dedupe", "removes duplicate values from a list while keeping their order"),
    ("most_common", "returns the most common element of a list"),
    ("char_count", "counts how often each character appears in a string"),
    ("is_anagram", "checks whether two strings are anagrams of each other"),
    ("to_celsius", "converts a temperature from Fahrenheit to Celsius"),
    ("to_fahrenheit", "converts a temperature from Celsius to Fahrenheit"),
    ("binary_search", "finds the index of a value in a sorted list with binary search"),
    ("bubble_sort", "sorts a list of numbers with bubble sort"),
    ("insertion_sort", "sorts a list of numbers with insertion sort"),
    ("merge_sort", "sorts a list of numbers with merge sort"),
    ("quick_sort", "sorts a list of numbers with quicksort"),
    ("matrix_transpose", "transposes a matrix given as a list of rows"),
    ("matrix_multiply", "multiplies two matrices given as lists of rows"),
    ("dot_product", "returns the dot product of two vectors"),
    ("mean", "returns the mean of a list of numbers"),
    ("median", "returns the median of a list of numbers"),
    ("variance", "returns the variance of a list of numbers"),
    ("running_total", "returns the running totals of a list of numbers"),
    ("rotate_list", "rotates a list to the right by k positions"),
    ("is_sorted", "checks whether a list is sorted in ascending order"),
    ("find_missing", "finds the missing number in a list containing 1 to n with one gap"),
    ("two_sum", "returns the indices of two numbers in a list that add up to a target"),
    ("count_digits", "counts the digits of an integer"),
    ("digit_sum", "returns the sum of the digits of an integer"),
    ("is_armstrong", "checks whether a number is an Armstrong number"),
    ("to_binary", "converts a non-negative integer to its binary string"),
    ("from_binary", "converts a binary string to an integer"),
    ("is_leap_year", "checks whether a year is a leap year"),
    ("days_in_month", "returns the number of days in a given month and year"),
    ("capitalize_words", "capitalizes the first letter of every word in a string"),
    ("snake_to_camel", "converts a snake_case string to camelCase"),
    ("camel_to_snake", "converts a camelCase string to snake_case"),
    ("strip_punctuation", "removes punctuation from a string"),
    ("longest_word", "returns the longest word in a sentence"),
    ("count_lines", "counts the lines in a text file"),
    ("read_csv_column", "reads a CSV file and returns the values of one column"),
    ("word_frequencies", "reads a text file and returns the ten most frequent words"),
    ("merge_dicts", "merges two dictionaries, adding the values of shared keys"),
    ("invert_dict", "swaps the keys and values of a dictionary"),
    ("group_by_length", "groups a list of words by their length in a dictionary"),
    ("filter_even", "returns only the even numbers of a list"),
    ("square_all", "returns the squares of all numbers in a list"),
    ("max_subarray", "returns the largest sum of a contiguous sublist"),
    ("fizzbuzz", "prints FizzBuzz for the numbers 1 to n"),
    ("power_set", "returns all subsets of a list"),
    ("permutations", "returns all permutations of a string"),
    ("balanced_brackets", "checks whether the brackets in a string are balanced"),
    ("roman_to_int", "converts a Roman numeral to an integer"),
    ("int_to_roman", "converts an integer to a Roman numeral"),
    ("caesar_cipher", "encrypts a string with a Caesar cipher of shift k"),
    ("vowel_ratio", "returns the fraction of letters in a string that are vowels"),
    ("remove_vowels", "removes all vowels from a string"),
    ("count_uppercase", "counts the uppercase letters in a string"),
    ("is_pangram", "checks whether a sentence contains every letter of the alphabet"),
    ("compress_string", "compresses a string with run-length encoding"),
    ("decompress_string", "expands a run-length encoded string"),
    ("second_smallest", "returns the second smallest value in a list"),
    ("kth_largest", "returns the k-th largest value in a list"),
    ("intersection", "returns the elements two lists have in common"),
    ("union_sorted", "returns the sorted union of two lists without duplicates"),
    ("list_difference", "returns the elements of one list that are not in another"),
    ("pairwise_sums", "returns the sums of neighbouring elements of a list"),
    ("validate_email", "checks whether a string looks like an email address"),
    ("parse_date", "parses a date string like 2024-03-15 into year, month and day"),
    ("seconds_to_hms", "converts a number of seconds into hours, minutes and seconds"),
    ("celsius_table", "prints a table of Celsius and Fahrenheit values from 0 to 100"),
    ("triangle_area", "returns the area of a triangle from its three sides"),
    ("circle_area", "returns the area of a circle from its radius"),
    ("distance", "returns the distance between two points in the plane"),
    ("is_perfect_square", "checks whether a number is a perfect square"),
    ("collatz_steps", "counts the steps of the Collatz sequence from n down to 1"),
    ("pascal_row", "returns the n-th row of Pascal's triangle"),
    ("primes_below", "returns all prime numbers below n with the sieve of Eratosthenes"),
    ("fibonacci_list", "returns the first n Fibonacci numbers as a list"),
    ("safe_divide", "divides two numbers and returns None when the divisor is zero"),
    ("clamp", "clamps a number between a lower and an upper bound"),
    ("is_number", "checks whether a string can be parsed as a number"),
    ("count_occurrences", "counts how many times a substring occurs in a string"),
    ("title_case", "converts a sentence to title case"),
    ("stack_class", "implements a stack with push, pop and peek"),
    ("queue_class", "implements a queue with enqueue and dequeue"),
    ("linked_list_reverse", "reverses a singly linked list"),
    ("tree_depth", "returns the depth of a binary tree"),
    ("tree_sum", "returns the sum of the values in a binary tree"),
    ("bfs", "does a breadth-first search on a graph given as an adjacency list"),
    ("dfs", "does a depth-first search on a graph given as an adjacency list"),
    ("shortest_path", "finds the shortest path length between two nodes of an unweighted graph"),
    ("memo_fib", "returns the n-th Fibonacci number with memoization"),
    ("hamming_distance", "returns the Hamming distance between two strings of equal length"),
    ("levenshtein", "returns the edit distance between two strings"),
    ("common_prefix", "returns the longest common prefix of a list of strings"),
    ("unique_chars", "checks whether all characters of a string are unique"),
    ("sum_of_squares", "returns the sum of the squares of the numbers from 1 to n"),
    ("average_word_length", "returns the average word length of a sentence"),
    ("nested_sum", "sums all numbers in a nested list of any depth"),
    ("retry", "calls a function up to three times until it stops raising an exception"),
    ("timer", "measures how long another function takes to run"),
    ("shuffle_list", "shuffles a list in place with the Fisher-Yates algorithm"),
    ("random_password", "generates a random password of a given length"),
    ("json_keys", "loads a JSON file and returns its top-level keys"),
    ("write_lines", "writes a list of strings to a file, one per line"),
]

LANGUAGES = ["Python"] * 6 + ["JavaScript", "C", "Rust", "Java", "Go", "TypeScript"]

CODE_PHRASINGS = [
    "Write a {lang} function that {task}.",
    "Write a {lang} function `{name}` that {task}.",
    "In {lang}, implement a function that {task}. Keep it short.",
    "Show me {lang} code for a function that {task}, with a one-line comment.",
    "Write a {lang} function that {task}, and give one example call.",
    "How do I write a function in {lang} that {task}?",
    "Write a short {lang} program that {task}.",
    "Can you write a {lang} function named `{name}` that {task}?",
]

# Small snippets to explain or fix; {a}, {b}, {c} are filled with small integers.
EXPLAIN_SNIPPETS = [
    "squares = [n * n for n in range({b}) if n % {a} == 0]",
    "total = sum(x for x in values if x > {c})",
    "words = sorted(text.split(), key=len, reverse=True)[:{a}]",
    "counts = {{w: text.count(w) for w in set(text.split())}}",
    "pairs = list(zip(names, scores))",
    "result = [row[{a}] for row in table if len(row) > {a}]",
    "evens = list(filter(lambda n: n % 2 == 0, range({b})))",
    "first = next((x for x in items if x > {c}), None)",
    "s = ''.join(reversed(s))",
    "matrix = [[0] * {a} for _ in range({b})]",
    "for i, line in enumerate(open('log.txt'), start=1):\n    if 'ERROR' in line:\n        print(i)",
    "while n > {a}:\n    n //= 2\n    steps += 1",
    "data = {{k: v for k, v in data.items() if v is not None}}",
    "unique = sorted(set(numbers))[-{a}:]",
    "avg = sum(nums) / len(nums) if nums else 0",
]
FIX_SNIPPETS = [
    ("returns the largest value of the list instead of crashing on an empty list",
     "def largest(nums):\n    return max(nums)"),
    ("counts the vowels instead of always returning {a}",
     "def count_vowels(s):\n    n = {a}\n    for ch in s:\n        if ch in 'aeiou':\n            n = 1\n    return n"),
    ("returns the sum of 1 to n inclusive",
     "def total(n):\n    return sum(range(n))"),
    ("reverses the list without changing the original",
     "def reversed_copy(xs):\n    xs.reverse()\n    return xs"),
    ("returns True for even numbers",
     "def is_even(n):\n    return n % 2 == 1"),
    ("returns the last {a} items of the list",
     "def last_items(xs):\n    return xs[:{a}]"),
    ("does not share the default list between calls",
     "def add_item(item, items=[]):\n    items.append(item)\n    return items"),
    ("returns the factorial of n for n = 0 too",
     "def factorial(n):\n    if n == 1:\n        return 1\n    return n * factorial(n - 1)"),
    ("counts the words in the sentence",
     "def word_count(s):\n    return len(s)"),
    ("returns the average of the numbers",
     "def average(a, b, c):\n    return a + b + c / 3"),
]

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi",
         "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Vik"]
ITEMS = [("apples", "boxes"), ("pencils", "packs"), ("eggs", "cartons"), ("books", "shelves"),
         ("cookies", "jars"), ("marbles", "bags"), ("stickers", "sheets"), ("cans", "crates")]
GOODS = ["notebook", "lamp", "jacket", "backpack", "bicycle", "board game", "pair of shoes",
         "kettle", "headphones", "chair"]
SUFFIXES = ["", " Show the steps.", " Show your work.", " Explain your answer.",
            " Answer with the steps."]


def math_prompt(r: random.Random) -> str:
    name, other = r.sample(NAMES, 2)
    item, box = r.choice(ITEMS)
    a, b, c = r.randint(2, 99), r.randint(2, 99), r.randint(2, 12)
    kind = r.randrange(20)
    if kind == 0:
        q = f"What is {r.randint(100, 999)} + {r.randint(100, 999)}?"
    elif kind == 1:
        q = f"What is {r.randint(500, 2000)} - {r.randint(100, 499)}?"
    elif kind == 2:
        q = f"Calculate {a} x {r.randint(11, 29)}."
    elif kind == 3:
        q = f"What is {c * r.randint(3, 40)} divided by {c}?"
    elif kind == 4:
        q = f"{name} has {c} {box} with {a} {item} each. {name} gives away {b} {item}. " \
            f"How many {item} are left?"
        if c * a < b:
            q = f"{name} has {c} {box} with {a} {item} each. How many {item} is that?"
    elif kind == 5:
        price, pct = r.randint(10, 200), r.choice([10, 15, 20, 25, 30, 40, 50])
        q = f"A {r.choice(GOODS)} costs ${price} and is on sale for {pct}% off. " \
            f"What is the sale price?"
    elif kind == 6:
        q = f"What is {r.choice([5, 10, 12, 15, 20, 25, 30, 75])}% of {r.randint(20, 900)}?"
    elif kind == 7:
        x, m = r.randint(1, 20), r.randint(2, 9)
        k = r.randint(1, 40)
        q = f"Solve for x: {m}x + {k} = {m * x + k}."
    elif kind == 8:
        d, h = r.randint(2, 9) * r.randint(10, 60), r.randint(2, 6)
        q = f"A car travels {d} km in {h} hours. What is its average speed?"
    elif kind == 9:
        w, h = r.randint(3, 30), r.randint(3, 30)
        q = f"A rectangle is {w} cm wide and {h} cm long. What are its area and perimeter?"
    elif kind == 10:
        nums = [r.randint(1, 100) for _ in range(r.randint(4, 6))]
        q = f"What is the average of {', '.join(map(str, nums))}?"
    elif kind == 11:
        q = f"Simplify the fraction {a * c}/{b * c}."
    elif kind == 12:
        q = f"What is 1/{c} + 1/{r.randint(2, 12)}?"
    elif kind == 13:
        q = f"{name} is {a % 40 + 5} years old and {other} is {c} years older. " \
            f"How old will {other} be in {r.randint(2, 15)} years?"
    elif kind == 14:
        q = f"A recipe needs {c} cups of flour for {r.choice([2, 3, 4])} people. " \
            f"How many cups are needed for {r.choice([6, 8, 9, 12])} people?"
    elif kind == 15:
        q = f"Is {r.randint(100, 999)} divisible by {r.choice([3, 4, 6, 7, 9, 11])}? Explain."
    elif kind == 16:
        q = f"What is {a} squared minus {c} cubed?"
    elif kind == 17:
        q = f"Convert {r.randint(2, 50) * 100} meters to kilometers."
    elif kind == 18:
        q = f"{name} saves ${c} a week. How many weeks until {name} has ${c * a}?"
    else:
        q = f"The ratio of {item} to {r.choice(ITEMS)[0]} is {c}:{r.randint(2, 9)}. " \
            f"If there are {c * r.randint(2, 9)} {item}, how many of the others are there?"
    return q if q.endswith("Explain.") else q + r.choice(SUFFIXES)


def code_prompt(r: random.Random) -> str:
    a, b, c = r.randint(2, 5), r.randint(6, 20), r.randint(0, 50)
    kind = r.random()
    if kind < 0.12:
        snippet = r.choice(EXPLAIN_SNIPPETS).format(a=a, b=b, c=c)
        lead = r.choice(["Explain what this code does:", "What does this Python code do?",
                         "Explain this Python snippet line by line:"])
        return f"{lead}\n\n```python\n{snippet}\n```"
    if kind < 0.22:
        goal, code = r.choice(FIX_SNIPPETS)
        return f"Fix this Python function so it {goal.format(a=a)}:\n\n" \
               f"```python\n{code.format(a=a)}\n```"
    name, task = r.choice(TASKS)
    lang = r.choice(LANGUAGES)
    if lang != "Python":
        name = "".join(w if i == 0 else w.title() for i, w in enumerate(name.split("_")))
    return r.choice(CODE_PHRASINGS).format(lang=lang, name=name, task=task)


def existing_prompts() -> set[str]:
    seen = set()
    for path in [*HERE.glob("*_prompts.jsonl"), *(ROOT / "eval").glob("*/*.jsonl")]:
        # *_prompts.jsonl: the hand-written files, not the *_prompts_templated.jsonl outputs
        for line in path.read_text().splitlines():
            if line.strip():
                seen.add(json.loads(line).get("prompt", ""))
    return seen


def distinct(make, n: int, r: random.Random, seen: set[str]) -> list[str]:
    """``n`` prompts from ``make`` that are not in ``seen`` (which grows with them)."""
    prompts: list[str] = []
    for _ in range(100 * n):
        if len(prompts) == n:
            return prompts
        p = make(r)
        if p not in seen:
            seen.add(p)
            prompts.append(p)
    raise SystemExit(f"only {len(prompts)} distinct prompts of {n}; ask for fewer")


def templated(n_code: int, n_math: int, seed: int) -> dict[str, list[str]]:
    """The templated prompts of each domain, none of them in another prompt file."""
    seen = existing_prompts()
    return {"code": distinct(code_prompt, n_code, random.Random(f"{seed}:code"), seen),
            "math": distinct(math_prompt, n_math, random.Random(f"{seed}:math"), seen)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=int, default=500, help="code prompts to write")
    ap.add_argument("--math", type=int, default=300, help="math prompts to write")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for domain, prompts in templated(args.code, args.math, args.seed).items():
        path = HERE / f"{domain}_prompts_templated.jsonl"
        atomic_write_text(path, "".join(json.dumps({"prompt": p, "domain": domain}) + "\n"
                                        for p in prompts))
        print(f"{path}: {len(prompts)} prompts")


if __name__ == "__main__":
    main()
