"""A prompt set that looks like what users send (issue 19 item 1), for train-draft and the evaluation.

    python -m sglaunch.training.prompt_set CORPUS_DIR --out DIR --seed 0 \
        [--train-count 100000] [--start 0] [--heldout-per-kind 150] [--gzip]

writes DIR/train.jsonl (or train.jsonl.gz), DIR/heldout.jsonl and DIR/manifest.json. Every record
is chat-form, `{"messages": [...], "kind": ..., "task": ..., "source": ...}`:

  chat        questions and instructions: explain a topic, creative writing, emails, plans, tips,
              comparisons, Python questions from the docs' section titles and stdlib names
  code        Python tasks over standard-library functions read with `ast` (write from the
              docstring, complete, explain, document, find the injected bug, test, translate) and
              templated write / explain / fix tasks in C, C++, JavaScript, TypeScript, Rust, Go,
              Java, plus SQL over a small schema and shell
  math        word problems from templates with seeded numbers
  passage     summarise / rewrite / translate / answer questions about a corpus passage
              (Shakespeare, Milton, Austen, KJV, Python docs paragraphs)
  multi-turn  an earlier user turn and an assistant turn (templated from the same sources: the
              worked answer, the stdlib function, the docs paragraph, ...), then a follow-up
  propose     (training only) asks the target to propose a user question; `--from-proposals`
              turns the target's answers to these into second-stage prompts of kind `proposed`

Held-out split, disjoint at the source level, by a stable hash: `--heldout-fraction` of the
literary texts' 4,000-character blocks (an excerpt never leaves its block) and of the docs
paragraphs, by their text; docs section titles, stdlib functions, topics, code tasks, snippets and
math templates by their name. So a held-out passage, function, topic or template never appears in
a training prompt, and the held-out sources spread over every work and every part of the docs.
(`sglaunch.training.corpus --train-text`, the older recipe's fixed text, takes windows from the
first 95% of every file, held-out blocks and functions included: keep it out of rounds that are
evaluated on this split.) Record i of the training
stream depends only on (seed, i): `--start` and `--train-count` cut fresh slices for later rounds.
Torch-free and deterministic for a seed and a corpus.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sglaunch.training.corpus import LITERARY, excerpt, titles

KINDS = ("chat", "code", "math", "passage", "multi-turn", "propose")
EVAL_KINDS = ("chat", "code", "math", "passage", "multi-turn")
TRAIN_WEIGHTS = {"chat": 0.24, "code": 0.26, "math": 0.12, "passage": 0.18, "multi-turn": 0.17, "propose": 0.03}
HELDOUT_PERMILLE_NAMES = 80   # stdlib functions (thousands of them)
HELDOUT_PERMILLE_SMALL = 200  # the hand-written catalogues below (tens to a hundred entries)
TEXT_BLOCK_CHARS = 4000      # the literary texts' held-out units
MAX_CODE_CHARS = 1400         # keeps prompts well inside train-draft's --max-length 768 tokens


def bucket(key: str) -> int:
    """A stable 0..999 bucket of a name (sha1, so independent of PYTHONHASHSEED and versions)."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16) % 1000


def split_names(items: list, key: Callable = str, permille: int = HELDOUT_PERMILLE_SMALL) -> tuple[list, list]:
    """(train, heldout) by the stable bucket of each item's key; both sides non-empty when there
    are at least two distinct keys."""
    train = [x for x in items if bucket(key(x)) >= permille]
    held = [x for x in items if bucket(key(x)) < permille]
    if not held and len({key(x) for x in items}) > 1:
        low = min(bucket(key(x)) for x in items)
        held = [x for x in items if bucket(key(x)) == low]
        train = [x for x in items if bucket(key(x)) != low]
    return train, held


# ---------------------------------------------------------------------------------------- catalogues
# (written for this project; no third-party text)

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "plate tectonics", "vaccines", "the immune system",
    "compound interest", "inflation", "supply and demand", "the Roman Empire", "the Industrial Revolution",
    "the printing press", "the French Revolution", "the Renaissance", "climate change", "renewable energy",
    "solar panels", "electric cars", "nuclear fission", "DNA", "evolution by natural selection",
    "the theory of relativity", "quantum entanglement", "machine learning", "neural networks", "the internet",
    "public-key cryptography", "blockchains", "the stock market", "index funds", "credit scores", "mortgages",
    "personal budgeting", "sleep", "meditation", "intermittent fasting", "coffee", "sourdough bread",
    "fermentation", "composting", "gardening on a balcony", "houseplants", "dog training", "how cats behave",
    "honey bees", "coral reefs", "rainforests", "deserts", "volcanoes", "earthquakes", "hurricanes",
    "the Apollo moon landings", "the solar system", "the exploration of Mars", "telescopes", "the human brain",
    "how memory works", "building habits", "procrastination", "public speaking", "job interviews", "remote work",
    "time management", "learning a new language", "chess openings", "jazz", "classical music",
    "the history of the guitar", "impressionist painting", "photography", "film noir", "Shakespeare's comedies",
    "Greek mythology", "the Olympic Games", "marathon training", "yoga", "nutrition labels", "vitamins",
    "antibiotics", "the placebo effect", "statistics", "probability", "the Pythagorean theorem", "prime numbers",
    "calculus", "game theory", "democracy", "the separation of powers", "the United Nations", "human rights",
    "urban planning", "public transport", "recycling", "plastic pollution", "ocean tides", "the seasons",
    "rainbows", "lightning", "the speed of light", "magnets", "lithium-ion batteries", "semiconductors",
    "3D printing", "open-source software", "version control", "cloud computing", "relational databases",
    "spreadsheets", "cybersecurity", "password managers", "phishing", "social media", "journalism",
    "critical thinking", "logical fallacies", "the scientific method", "the philosophy of mind", "stoicism",
    "utilitarianism", "ancient Egypt", "the Silk Road", "the Vikings", "the Ming dynasty", "the Cold War",
    "central banks", "income tax", "tipping customs around the world", "jet lag", "packing light for a trip",
    "camping", "cooking rice", "knife skills", "fresh pasta", "wine tasting", "tea", "minimalism",
    "decluttering", "toddler tantrums", "teenagers and sleep", "friendship", "negotiation", "giving feedback",
    "writing a CV", "the metric system", "time zones", "leap years", "the history of writing", "maps and map projections",
    "bridges", "skyscrapers", "airplanes and lift", "submarines", "the Great Barrier Reef", "glaciers",
    "the ozone layer", "recessions", "universal basic income", "electric guitars", "video game design",
    "animation", "podcasting", "typography", "colour theory", "the Fibonacci sequence", "chaos theory",
]
TOPIC_ASKS = [
    "Explain {t} in simple terms.", "What is {t}?", "Can you give me a short overview of {t}?",
    "How does {t} work?", "Why does {t} matter?", "What are the most common misconceptions about {t}?",
    "Explain {t} to a ten-year-old.", "I'm a complete beginner. Where should I start with {t}?",
    "Write a short blog post introducing {t}.", "Give me five interesting facts about {t}.",
    "What are the pros and cons of {t}?", "Summarize the key ideas behind {t} in a few bullet points.",
    "What is the history of {t}, briefly?", "How would you explain {t} in one paragraph?",
    "What questions should I ask to understand {t} better?", "Write a short quiz about {t}: three questions with answers.",
    "How can I learn more about {t}?", "Tell me something surprising about {t}.", "Describe {t} using an analogy.",
    "what's the deal with {t}?", "quick question: how does {t} actually work", "Can you explain {t} like I'm five?",
    "I have an exam tomorrow on {t}. What are the main points I should remember?",
    "Write a tweet-length explanation of {t}.", "Create a two-week study plan for learning about {t}.",
    "Outline a ten-minute presentation about {t}.", "What do experts still disagree about when it comes to {t}?",
    "Give a simple example that illustrates {t}.", "How has our understanding of {t} changed over time?",
    "My friend says {t} is overrated. What would you say to that?", "Write three discussion questions about {t} for a class.",
    "Explain {t} in exactly three sentences.", "What is one thing everyone should know about {t}?",
]
PREFACES = ["", "", "", "", "", "", "I'm a nurse. ", "My son asked me this and I didn't know: ", "For a presentation at work: ",
            "Hi! ", "Hello, ", "I've always wondered: ", "Settle an argument for us. ", "As a complete beginner: ",
            "Please help. ", "For my blog: ", "I'm studying for a test. "]
MODIFIERS = ["", "", "", " Keep it under 100 words.", " Keep it short.", " Write it for a general audience.",
             " Use bullet points.", " Please be concise.", " Include an example.", " Answer in two short paragraphs.", " Avoid jargon.", " Be detailed.", " Use a friendly tone."]
FORMS = ["a haiku", "a short poem", "a limerick", "a four-line rhyme", "the opening paragraph of a short story",
         "a short fable with a moral", "a product description", "a motivational message", "a short wedding toast",
         "a one-minute speech", "a diary entry", "a song chorus", "a riddle", "a bedtime story", "a sonnet",
         "a short scene of dialogue", "a postcard message", "a slogan"]
SUBJECTS = ["the sea", "autumn leaves", "a lost umbrella", "a robot learning to cook", "the first day of school",
            "a lighthouse keeper", "a city at night", "an old bicycle", "a cat who hates Mondays",
            "a dragon afraid of fire", "moving to a new town", "the last train home", "a garden in winter",
            "a time traveller's lunch", "friendship", "a rainy Sunday", "the smell of fresh bread", "mountains",
            "a detective's retirement", "a forgotten library", "a snowman in spring", "the moon", "a busy market",
            "a grandmother's recipe book", "learning to swim", "a broken clock", "a lonely satellite",
            "the end of summer", "a kite", "a village festival", "coffee in the morning", "a shy ghost",
            "a stray dog", "the wind", "an unexpected letter", "a chess game", "a paper boat", "a tiny house"]
OCCASIONS = ["", "", " for a school project", " for my grandmother's birthday card", " for our team newsletter",
             " for a writing class", " to read to my kids"]
CREATIVE_ASKS = ["Write {f} about {s}{o}.", "Compose {f} about {s}{o}.", "Can you write me {f} about {s}{o}?",
                 "I need {f} about {s}{o}.", "write {f} about {s}", "Please write {f} on the theme of {s}{o}."]
RECIPIENTS = ["my landlord", "my manager", "a customer", "my child's teacher", "a colleague", "a new client",
              "a hotel", "the city council", "my neighbour", "a professor"]
PURPOSES = ["asking to move our meeting to next week", "about a broken heating system", "asking for a day off",
            "apologising for a late delivery", "following up on a job application", "declining an invitation politely",
            "thanking them for their help", "about noise late at night", "asking for a refund",
            "introducing myself", "asking for an extension on a deadline", "confirming a booking"]
ACTIVITIES = ["sleeping better", "saving money on groceries", "staying focused while studying", "running my first 5k",
              "writing clean code", "keeping houseplants alive", "learning to draw", "making friends in a new city",
              "reducing screen time", "cooking for one", "travelling on a budget", "preparing for a job interview",
              "starting a podcast", "keeping a journal", "working from home", "reading more books",
              "negotiating a salary", "learning to play the piano", "staying motivated at the gym", "public speaking",
              "taking better photos with my phone", "organising my email inbox", "hosting a dinner party"]
PLACES = ["Lisbon", "Kyoto", "the Scottish Highlands", "New York City", "Iceland", "Rome", "Mexico City", "Vancouver",
          "Istanbul", "Cape Town", "Yellowstone", "the Amalfi coast", "Prague", "Seoul", "Buenos Aires", "Marrakesh"]
TRAVELLERS = ["a family with two kids", "a solo traveller", "a couple on a budget", "two friends who love food",
              "a retired couple", "a student backpacker"]
NAMED_THINGS = ["a coffee shop", "a bakery", "a fantasy kingdom", "a pet hamster", "a productivity app", "a hiking club",
                "a rock band", "a newsletter about gardening", "a board game", "a sailing boat", "a bookshop"]
SITUATIONS = ["buying a used car", "choosing a laptop for programming", "adopting a dog", "renting my first apartment",
              "switching careers", "choosing a university", "starting a small business", "planning a wedding",
              "buying a bicycle for commuting", "choosing a programming language to learn", "moving abroad"]
PLANS = ["meal plan", "workout plan", "study schedule", "cleaning schedule", "reading plan"]
PLAN_FOR = ["a busy student", "a vegetarian", "a beginner runner", "a family of four", "someone who works night shifts"]
DOCS_TO_WRITE = ["a cover letter for a junior data analyst position", "a short bio for my personal website",
                 "a review of a pair of headphones", "a LinkedIn summary for a nurse", "a thank-you note to a teacher",
                 "an agenda for a team meeting", "a short speech for my sister's graduation",
                 "a message asking my team for feedback", "a polite reminder about an unpaid invoice"]
MEDIA = ["books", "films", "board games", "podcasts", "documentaries"]
LIKES = ["science fiction", "history", "cooking", "puzzles", "mystery novels", "nature", "space", "philosophy"]
PRACTICAL: list[Callable[[random.Random], str]] = [
    lambda r: f"Write an email to {r.choice(RECIPIENTS)} {r.choice(PURPOSES)}.",
    lambda r: f"Help me write a short email to {r.choice(RECIPIENTS)} {r.choice(PURPOSES)}. Keep it polite.",
    lambda r: f"Give me {r.randint(3, 10)} tips for {r.choice(ACTIVITIES)}.",
    lambda r: f"What are some good ways of {r.choice(ACTIVITIES)}?",
    lambda r: f"Plan a {r.randint(2, 7)}-day trip to {r.choice(PLACES)} for {r.choice(TRAVELLERS)}.",
    lambda r: f"Suggest {r.randint(3, 10)} names for {r.choice(NAMED_THINGS)}.",
    lambda r: f"What should I consider when {r.choice(SITUATIONS)}?",
    lambda r: f"I'm thinking about {r.choice(SITUATIONS)}. What questions should I ask myself first?",
    lambda r: f"Make a weekly {r.choice(PLANS)} for {r.choice(PLAN_FOR)}.",
    lambda r: f"Help me write {r.choice(DOCS_TO_WRITE)}.",
    lambda r: f"Recommend {r.randint(3, 8)} {r.choice(MEDIA)} for someone who likes {r.choice(LIKES)}.",
    lambda r: f"Create a packing list for a {r.randint(2, 14)}-day trip to {r.choice(PLACES)}.",
]
PAIRS = [("a virus", "a bacterium"), ("weather", "climate"), ("stocks", "bonds"), ("TCP", "UDP"), ("RAM", "disk storage"),
         ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("'affect'", "'effect'"), ("speed", "velocity"),
         ("mass", "weight"), ("a list", "a tuple in Python"), ("Python", "JavaScript"), ("SQL", "NoSQL databases"),
         ("machine learning", "traditional programming"), ("espresso", "drip coffee"), ("a debit card", "a credit card"),
         ("empathy", "sympathy"), ("a hurricane", "a tornado"), ("a comet", "an asteroid"), ("a latte", "a cappuccino"),
         ("HTTP", "HTTPS"), ("a compiler", "an interpreter"), ("git merge", "git rebase"), ("a process", "a thread"),
         ("an LED", "an incandescent bulb"), ("a republic", "a democracy"), ("a simile", "a metaphor"),
         ("frogs", "toads"), ("a star", "a planet"), ("renting", "buying a home"), ("Linux", "Windows"),
         ("a Roth IRA", "a traditional IRA"), ("AC", "DC current"), ("a psychologist", "a psychiatrist")]
COMPARE_ASKS = ["What is the difference between {a} and {b}?", "Compare {a} and {b}.", "How do {a} and {b} differ?",
                "Is {a} the same as {b}?", "{A} or {b}: what are the trade-offs?", "Explain {a} versus {b} with examples."]
PY_TITLE_ASKS = ["What is {t} in Python?", "Explain {t} with a short example.", "When should I use {t}?",
                 "Write a short tutorial introduction to {t}.", "How does {t} work in Python?",
                 "I'm new to Python. Can you explain {t}?", "What are common mistakes people make with {t} in Python?"]
PY_NAME_ASKS = ["How do I use `{n}` in Python?", "What does `{n}` do?", "Can you show me an example of `{n}`?",
                "When would I use `{n}` instead of writing my own code?", "What arguments does `{n}` take?",
                "Is `{n}` part of the Python standard library? What is it for?"]
SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant. Answer briefly.",
           "You are an expert software engineer.", "You are a friendly tutor who explains things step by step.",
           "You are a helpful assistant that answers in plain English.", "You are a patient maths teacher."]

LANGS = ["Python", "C", "C++", "JavaScript", "TypeScript", "Rust", "Go", "Java"]
LANG_WEIGHTS = [3, 2, 1, 2, 1, 2, 2, 1]
CODE_TASKS = [  # (id, description after "a function that ...")
    ("fizzbuzz", "prints the numbers from 1 to {n}, printing Fizz for multiples of 3, Buzz for multiples of 5 and FizzBuzz for both"),
    ("palindrome", "checks whether a string is a palindrome, ignoring case and punctuation"),
    ("reverse-words", "reverses the order of the words in a sentence"),
    ("word-count", "counts how often each word appears in a text and returns the {k} most common words"),
    ("fibonacci", "returns the {n}th Fibonacci number without recursion"),
    ("gcd", "computes the greatest common divisor of two integers"),
    ("sieve", "returns all prime numbers below {n} using the sieve of Eratosthenes"),
    ("binary-search", "does a binary search in a sorted array of integers and returns the index of the target, or -1"),
    ("merge-sorted", "merges two sorted arrays into a single sorted array"),
    ("dedupe", "removes duplicates from an array while keeping the original order"),
    ("flatten", "flattens a nested list of integers into a flat list"),
    ("matrix-multiply", "multiplies two matrices given as two-dimensional arrays"),
    ("transpose", "transposes a matrix"),
    ("rle", "run-length encodes a string, so that \"aaabcc\" becomes \"a3b1c2\""),
    ("balanced", "checks whether a string of brackets like ()[]{{}} is balanced"),
    ("roman-to-int", "converts a Roman numeral to an integer"),
    ("int-to-roman", "converts an integer between 1 and 3999 to a Roman numeral"),
    ("celsius", "converts a list of temperatures from Celsius to Fahrenheit"),
    ("kadane", "finds the largest sum of a contiguous subarray"),
    ("rotate", "rotates an array to the right by {k} positions"),
    ("anagram", "checks whether two strings are anagrams of each other"),
    ("vowels", "counts the vowels in a string"),
    ("median", "returns the median of an array of numbers"),
    ("stack", "implements a stack with push, pop and peek"),
    ("queue-two-stacks", "implements a queue using two stacks"),
    ("reverse-list", "reverses a singly linked list"),
    ("lru", "implements an LRU cache that holds at most {k} entries"),
    ("csv-line", "parses one line of comma-separated values, including quoted fields that contain commas"),
    ("wc", "reads a text file and returns its number of lines, words and characters"),
    ("caesar", "encrypts a string with a Caesar cipher with a shift of {k}"),
    ("hex-rgb", "converts a hex colour like \"#1e90ff\" to its red, green and blue values"),
    ("leap-year", "checks whether a year is a leap year"),
    ("digit-sum", "returns the sum of the digits of a non-negative integer"),
    ("factorial", "computes the factorial of n and reports an error for negative n"),
    ("insertion-sort", "sorts an array of integers with insertion sort"),
    ("quicksort", "sorts an array of integers with quicksort"),
    ("two-sum", "finds two numbers in an array that add up to a target and returns their indices"),
    ("top-char", "returns the most frequent character in a string"),
    ("capitalize", "capitalizes the first letter of every word in a sentence"),
    ("bfs", "does a breadth-first search over a graph given as an adjacency list and returns the visiting order"),
    ("dijkstra", "computes shortest-path distances from a start node with Dijkstra's algorithm"),
    ("is-prime", "checks whether a number is prime"),
    ("power-set", "returns all subsets of a set of numbers"),
    ("permutations", "returns all permutations of a string"),
    ("islands", "counts the islands of 1s in a grid of 0s and 1s"),
    ("stats", "reads numbers from standard input and prints their minimum, maximum and mean"),
    ("domain", "extracts the domain name from a URL"),
    ("email", "checks whether a string looks like an email address, using simple rules"),
    ("retry", "calls another function and retries it up to {k} times with exponential backoff"),
    ("chunk", "splits an array into chunks of size {k}"),
    ("binary-string", "converts a non-negative integer to its binary representation as a string"),
    ("pascal", "returns the first {n} rows of Pascal's triangle"),
    ("matrix-spiral", "returns the elements of a matrix in spiral order"),
    ("interval-merge", "merges overlapping intervals"),
]
WRITE_ASKS = ["Write a {lang} function that {d}.", "In {lang}, how would I write a function that {d}?",
              "Can you implement a function in {lang} that {d}?", "I need a {lang} program that {d}. Please add comments.",
              "Show me idiomatic {lang} code for a function that {d}.",
              "Write a {lang} function that {d}, and explain its time complexity.",
              "write {lang} code for a function that {d}", "Implement this in {lang}: a function that {d}. Add a usage example.",
              "Give me a {lang} solution: write a function that {d}.",
              "Using {lang}, write a function that {d}. Handle edge cases such as empty input.",
              "I'm learning {lang}. Could you write a function that {d} and walk me through it?",
              "What's the cleanest way to write a function that {d} in {lang}?"]
SNIPPETS = {  # (id, language, code, buggy code)
    "c-sum": ("C", "int sum(const int *a, int n) {\n    int total = 0;\n    for (int i = 0; i < n; i++)\n        total += a[i];\n    return total;\n}",
              "int sum(const int *a, int n) {\n    int total = 0;\n    for (int i = 0; i <= n; i++)\n        total += a[i];\n    return total;\n}"),
    "c-strlen": ("C", "size_t my_strlen(const char *s) {\n    const char *p = s;\n    while (*p)\n        p++;\n    return p - s;\n}",
                 "size_t my_strlen(const char *s) {\n    const char *p = s;\n    while (*p)\n        p++;\n    return p - s - 1;\n}"),
    "c-max": ("C", "int max_of(const int *a, int n) {\n    int best = a[0];\n    for (int i = 1; i < n; i++)\n        if (a[i] > best)\n            best = a[i];\n    return best;\n}",
              "int max_of(const int *a, int n) {\n    int best = 0;\n    for (int i = 1; i < n; i++)\n        if (a[i] > best)\n            best = a[i];\n    return best;\n}"),
    "js-chunk": ("JavaScript", "function chunk(items, size) {\n  const out = [];\n  for (let i = 0; i < items.length; i += size) {\n    out.push(items.slice(i, i + size));\n  }\n  return out;\n}",
                 "function chunk(items, size) {\n  const out = [];\n  for (let i = 0; i < items.length; i += size) {\n    out.push(items.slice(i, size));\n  }\n  return out;\n}"),
    "js-vowels": ("JavaScript", "function countVowels(text) {\n  let count = 0;\n  for (const ch of text.toLowerCase()) {\n    if ('aeiou'.includes(ch)) count++;\n  }\n  return count;\n}",
                  "function countVowels(text) {\n  let count = 0;\n  for (const ch of text) {\n    if ('aeiou'.includes(ch)) count++;\n  }\n  return count;\n}"),
    "js-average": ("JavaScript", "const average = (values) =>\n  values.length === 0 ? 0 : values.reduce((a, b) => a + b, 0) / values.length;",
                   "const average = (values) =>\n  values.reduce((a, b) => a + b) / values.length;"),
    "rs-largest": ("Rust", "fn largest(values: &[i32]) -> Option<i32> {\n    let mut best = *values.first()?;\n    for &v in values {\n        if v > best {\n            best = v;\n        }\n    }\n    Some(best)\n}",
                   "fn largest(values: &[i32]) -> Option<i32> {\n    let mut best = *values.first()?;\n    for &v in values {\n        if v < best {\n            best = v;\n        }\n    }\n    Some(best)\n}"),
    "rs-palindrome": ("Rust", "fn is_palindrome(s: &str) -> bool {\n    let chars: Vec<char> = s.chars().filter(|c| c.is_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect();\n    chars.iter().eq(chars.iter().rev())\n}",
                      "fn is_palindrome(s: &str) -> bool {\n    let chars: Vec<char> = s.chars().collect();\n    chars.iter().eq(chars.iter().rev())\n}"),
    "rs-count": ("Rust", "use std::collections::HashMap;\n\nfn word_counts(text: &str) -> HashMap<String, usize> {\n    let mut counts = HashMap::new();\n    for word in text.split_whitespace() {\n        *counts.entry(word.to_lowercase()).or_insert(0) += 1;\n    }\n    counts\n}",
                 "use std::collections::HashMap;\n\nfn word_counts(text: &str) -> HashMap<String, usize> {\n    let mut counts = HashMap::new();\n    for word in text.split(' ') {\n        counts.insert(word.to_lowercase(), 1);\n    }\n    counts\n}"),
    "go-reverse": ("Go", "func Reverse(s string) string {\n\tr := []rune(s)\n\tfor i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {\n\t\tr[i], r[j] = r[j], r[i]\n\t}\n\treturn string(r)\n}",
                   "func Reverse(s string) string {\n\tb := []byte(s)\n\tfor i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {\n\t\tb[i], b[j] = b[j], b[i]\n\t}\n\treturn string(b)\n}"),
    "go-sum": ("Go", "func Sum(nums []int) int {\n\ttotal := 0\n\tfor _, n := range nums {\n\t\ttotal += n\n\t}\n\treturn total\n}",
               "func Sum(nums []int) int {\n\ttotal := 0\n\tfor i := range nums {\n\t\ttotal += i\n\t}\n\treturn total\n}"),
    "go-contains": ("Go", "func Contains(items []string, want string) bool {\n\tfor _, item := range items {\n\t\tif item == want {\n\t\t\treturn true\n\t\t}\n\t}\n\treturn false\n}",
                    "func Contains(items []string, want string) bool {\n\tfor _, item := range items {\n\t\tif item == want {\n\t\t\treturn true\n\t\t}\n\t\treturn false\n\t}\n\treturn false\n}"),
    "sh-backup": ("Bash", "#!/bin/sh\nset -eu\nsrc=$1\ndest=${2:-/tmp}\nstamp=$(date +%Y%m%d-%H%M%S)\ntar -czf \"$dest/backup-$stamp.tar.gz\" -C \"$src\" .\necho \"saved $dest/backup-$stamp.tar.gz\"",
                  "#!/bin/sh\nset -eu\nsrc=$1\ndest=${2:-/tmp}\nstamp=$(date +%Y%m%d-%H%M%S)\ntar -czf $dest/backup-$stamp.tar.gz $src\necho \"saved $dest/backup-$stamp.tar.gz\""),
    "java-fact": ("Java", "public static long factorial(int n) {\n    if (n < 0) throw new IllegalArgumentException(\"n < 0\");\n    long result = 1;\n    for (int i = 2; i <= n; i++) result *= i;\n    return result;\n}",
                  "public static int factorial(int n) {\n    int result = 1;\n    for (int i = 2; i < n; i++) result *= i;\n    return result;\n}"),
}
CODE_MODIFIERS = ["", "", "", " Use no external libraries.", " Include a few tests.", " Keep it short.",
                  " Explain the code afterwards.", " Make it efficient for large inputs.", " Add error handling.",
                  " Use descriptive variable names.", " Don't use recursion.", " Add a docstring or doc comment."]
SQL_MODIFIERS = ["", "", " Use PostgreSQL.", " Use MySQL syntax.", " Explain how the query works.",
                 " Use a common table expression.", " Avoid subqueries if you can.", " Format it nicely."]
SHELL_MODIFIERS = ["", "", " Explain each part of the command.", " It should work on macOS too.",
                   " Make it safe for file names with spaces.", " Keep it to one line if possible.", " Add error handling."]
SNIPPET_ASKS = ["Explain this {lang} code:", "What does this {lang} function do?", "Add comments to this {lang} code:",
                "Translate this {lang} code into Python:", "Review this {lang} code. Is there anything you would change?",
                "Can you walk me through this {lang} code line by line?"]
FIX_ASKS = ["This {lang} function has a bug. Find it and fix it:", "Why doesn't this {lang} code work correctly?",
            "There is a bug in the following {lang} code. What is it?", "Debug this {lang} code for me:",
            "My {lang} function gives wrong results. Can you fix it?"]
SCHEMA = ("customers(id, name, email, country, created_at)\norders(id, customer_id, total, status, created_at)\n"
          "products(id, name, category, price)\norder_items(order_id, product_id, quantity)\n"
          "employees(id, name, department, salary, manager_id, hired_on)")
SQL_TASKS = [
    ("sql-top-customers", "find the {k} customers with the highest total order amount"),
    ("sql-orders-month", "count the orders per month in {year}"),
    ("sql-never-ordered", "list the products that have never been ordered"),
    ("sql-above-manager", "find the employees who earn more than their manager"),
    ("sql-avg-salary", "compute the average salary per department, highest first"),
    ("sql-dedupe", "delete duplicate customers with the same email, keeping the lowest id"),
    ("sql-second-salary", "find the second highest salary"),
    ("sql-recent-country", "list the customers from {country} who ordered in the last 30 days"),
    ("sql-create-blog", "create tables for blog posts and their comments, with foreign keys"),
    ("sql-index", "speed up looking up the orders of a customer"),
    ("sql-running-total", "compute a running total of order amounts by date"),
    ("sql-top-category", "find the product category with the highest revenue"),
    ("sql-reports", "show every employee with the number of people who report to them"),
    ("sql-mismatch", "find orders whose total does not match the sum of their items"),
    ("sql-no-orders", "find the customers who have never placed an order"),
    ("sql-status", "count the orders in each status and show the share of each"),
    ("sql-hired", "list the employees hired in {year}, grouped by department"),
    ("sql-pivot", "show each customer's number of orders per year as columns"),
]
SQL_ASKS = ["Write a SQL query to {t}.", "Given these tables:\n\n{schema}\n\nWrite a query to {t}.",
            "How do I {t} in PostgreSQL?", "Using the schema below, {t}.\n\n{schema}",
            "SQL question: {t}. Tables:\n{schema}", "Write a SQLite query that will {t}."]
SHELL_TASKS = [
    ("sh-big-files", "find all files larger than {n} MB under {dir}"),
    ("sh-count-lines", "count the lines in all .{ext} files in a directory tree"),
    ("sh-lowercase", "rename all .{ext} files in the current directory to lowercase names"),
    ("sh-top-ips", "print the {k} most frequent IP addresses in a web server access log"),
    ("sh-old-logs", "delete log files older than {n} days in {dir}"),
    ("sh-backup", "back up a directory into a tar.gz archive named with today's date"),
    ("sh-health", "check every minute whether a website answers with HTTP 200 and log the failures"),
    ("sh-replace", "replace a string in every file of a git repository"),
    ("sh-du", "show the disk usage of each subdirectory, largest first"),
    ("sh-port", "find and stop the process listening on port {port}"),
    ("sh-tail", "follow a log file and print only the lines that contain ERROR"),
    ("sh-download", "download a list of URLs from a file, four at a time"),
    ("sh-images", "convert every .png image in a folder to .jpg"),
    ("sh-today", "print the total size of the files modified today"),
    ("sh-csv", "print the second column of a CSV file"),
    ("sh-unzip", "extract every .zip file in a folder into its own directory"),
    ("sh-commits", "count the commits per author in a git repository"),
    ("sh-env", "check that a list of environment variables is set before a script continues"),
]
SHELL_ASKS = ["Write a bash script to {t}.", "How can I {t} from the command line?", "Give me a shell one-liner to {t}.",
              "I'm on Linux. How do I {t}?", "Write a POSIX sh script that will {t}, with comments.",
              "What's the command to {t}?"]
PY_WRITE_ASKS = ["Write a Python function `{sig}` that {doc}", "Implement `{sig}` in Python. It should {doc}",
                 "Can you write a Python function {name} that {doc}", "I need a function `{sig}`: it {doc} Please write it.",
                 "In Python, write `{sig}`. Docstring: {doc}"]
PY_SOURCE_ASKS = [
    ("explain", "Explain what this Python code does:"), ("explain", "What does this function do?"),
    ("explain", "Can you walk me through this code?"), ("docstring", "Write a docstring for this function:"),
    ("docstring", "Document this Python function:"), ("review", "Review this Python code and suggest improvements:"),
    ("refactor", "Refactor this function to make it easier to read:"), ("types", "Add type hints to this function:"),
    ("tests", "Write pytest unit tests for this function:"), ("tests", "How would you test this function?"),
    ("complexity", "What is the time complexity of this code?"),
]
PY_TRANSLATE_TO = ["JavaScript", "Rust", "Go", "C++", "Java", "TypeScript"]
PY_FIX_ASKS = ["This Python function has a bug. Find and fix it:", "Something is wrong with this function. What is it?",
               "Find the bug in this Python code:", "This code doesn't behave as its docstring says. Fix it:"]
PY_COMPLETE_ASKS = ["Complete this Python function:", "Finish the implementation:", "Fill in the rest of this function:"]

NAMES = ["Ava", "Ben", "Chloe", "Daniel", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Kemi", "Liam", "Maya",
         "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wei", "Ximena", "Yusuf", "Zoe",
         "Priya", "Mateo", "Lena", "Omar", "Sofia", "Kenji", "Amara", "Lucas", "Nadia", "Theo"]
ITEMS = ["apples", "stickers", "marbles", "books", "cookies", "pencils", "stamps", "shells", "cards", "tomatoes"]
MATH_PREFIXES = ["", "", "", "Solve this: ", "Math question: ", "Can you help me with my homework? ", "Quick one: "]
MATH_SUFFIXES = ["", "", " Show your work.", " Explain step by step.", " Just give the final answer.",
                 " Please explain your reasoning.", " Think it through carefully."]


def _money(x: float) -> str:
    return f"{x:,.2f}"


def _m_items(r):
    a, b = r.randint(5, 60), r.randint(2, 40)
    c = r.randint(1, a + b - 1)
    n1, n2, it = r.choice(NAMES), r.choice(NAMES), r.choice(ITEMS)
    return f"{n1} has {a} {it}. {n1} buys {b} more and gives {c} to {n2}. How many {it} does {n1} have now?", str(a + b - c)


def _m_speed(r):
    h, v = r.randint(2, 9), r.randint(40, 120)
    return f"A train travels {h * v} km in {h} hours. What is its average speed?", f"{v} km/h"


def _m_discount(r):
    p, d = r.randint(20, 400), r.choice([10, 15, 20, 25, 30, 40, 50])
    return f"A jacket costs ${p}. It is on sale for {d}% off. What is the sale price?", f"${_money(p * (100 - d) / 100)}"


def _m_simple_interest(r):
    p, rate, y = r.randint(5, 100) * 100, r.choice([2, 3, 4, 5, 6]), r.randint(2, 10)
    n = r.choice(NAMES)
    return (f"{n} puts ${p} in a savings account that pays {rate}% simple interest per year. How much interest "
            f"does {n} earn after {y} years?", f"${_money(p * rate * y / 100)}")


def _m_compound(r):
    p, rate, y = r.randint(10, 100) * 100, r.choice([3, 4, 5, 6, 7]), r.randint(2, 6)
    return (f"You invest ${p} at {rate}% interest compounded once a year. What is the balance after {y} years? "
            "Round to the nearest cent.", f"${_money(p * (1 + rate / 100) ** y)}")


def _m_rectangle(r):
    l, w = r.randint(3, 40), r.randint(2, 30)
    return (f"A rectangular garden is {l} m long and {w} m wide. What is its area, and how much fencing goes "
            "around it?", f"area {l * w} m², fencing {2 * (l + w)} m")


def _m_linear(r):
    a, x, b = r.randint(2, 12), r.randint(-10, 20), r.randint(-30, 30)
    return f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {a * x + b}.", f"x = {x}"


def _m_number(r):
    k, x, b = r.choice([2, 3, 4, 5]), r.randint(2, 40), r.randint(1, 30)
    word = {2: "Twice", 3: "Three times", 4: "Four times", 5: "Five times"}[k]
    return f"{word} a number plus {b} equals {k * x + b}. What is the number?", str(x)


def _m_ages(r):
    b, k, n = r.randint(3, 40), r.randint(1, 15), r.randint(1, 10)
    n1, n2 = r.sample(NAMES, 2)
    s = (b + k + n) + (b + n)
    return (f"{n1} is {k} years older than {n2}. In {n} years the sum of their ages will be {s}. How old is {n2} now?",
            str(b))


def _m_work(r):
    x, y = r.choice([(2, 3), (3, 6), (4, 12), (6, 12), (5, 20), (10, 15), (4, 6), (12, 24)])
    n1, n2 = r.sample(NAMES, 2)
    return (f"{n1} can paint a fence in {x} hours and {n2} can paint it in {y} hours. How long does it take them "
            "working together?", f"{x * y / (x + y):g} hours")


def _m_average(r):
    scores = [r.randint(55, 100) for _ in range(r.randint(3, 6))]
    n = r.choice(NAMES)
    return f"{n}'s test scores are {', '.join(map(str, scores))}. What is the average score?", f"{sum(scores) / len(scores):.2f}"


def _m_seconds(r):
    d = r.randint(2, 30)
    return f"How many seconds are there in {d} days?", str(d * 86400)


def _m_recipe(r):
    n, g, m = r.choice([2, 4, 6, 8]), r.randint(1, 9) * 50, r.randint(3, 20)
    return f"A recipe for {n} people needs {g} grams of flour. How much flour is needed for {m} people?", f"{g * m / n:g} g"


def _m_shopping(r):
    a, p, b, q = r.randint(2, 9), r.randint(1, 9) + r.choice([0, 0.5, 0.25]), r.randint(2, 12), r.choice([0.5, 0.75, 1.2, 2])
    n = r.choice(NAMES)
    total = a * p + b * q
    bill = next(x for x in (10, 20, 50, 100, 200) if x >= total)
    return (f"{n} buys {a} notebooks at ${_money(p)} each and {b} pens at ${_money(q)} each, and pays with a "
            f"${bill} bill. How much change does {n} get?", f"${_money(bill - total)}")


def _m_clock_end(r):
    h, m, d = r.randint(1, 11), r.choice([0, 10, 15, 20, 30, 45, 50]), r.randint(80, 190)
    end = h * 60 + m + d
    return (f"A film starts at {h}:{m:02d} pm and lasts {d} minutes. What time does it end?",
            f"{(end // 60 - 1) % 12 + 1}:{end % 60:02d}")


def _m_fractions(r):
    from fractions import Fraction

    a, b, c, d = r.randint(1, 9), r.randint(2, 12), r.randint(1, 9), r.randint(2, 12)
    return f"What is {a}/{b} + {c}/{d}? Give the answer as a fraction in lowest terms.", str(Fraction(a, b) + Fraction(c, d))


def _m_ratio(r):
    a, b, k = r.randint(1, 7), r.randint(1, 7), r.randint(2, 6)
    return (f"The ratio of boys to girls in a class is {a}:{b}. If there are {(a + b) * k} students, how many are "
            "girls?", str(b * k))


def _m_dice(r):
    s = r.randint(2, 12)
    ways = sum(1 for i in range(1, 7) for j in range(1, 7) if i + j == s)
    return f"Two fair dice are rolled. What is the probability that the sum is {s}?", f"{ways}/36"


def _m_marbles(r):
    red, blue = r.randint(2, 9), r.randint(2, 9)
    from fractions import Fraction

    p = Fraction(red, red + blue) * Fraction(red - 1, red + blue - 1)
    return (f"A bag holds {red} red and {blue} blue marbles. Two are drawn without replacement. What is the "
            "probability that both are red?", str(p))


def _m_ladder(r):
    k = r.randint(1, 4)
    a, b, c = (k * x for x in r.choice([(3, 4, 5), (5, 12, 13), (8, 15, 17), (7, 24, 25), (20, 21, 29)]))
    return (f"A ladder {c} m long leans against a wall with its foot {a} m from the wall. How high up the wall does "
            "it reach?", f"{b} m")


def _m_circle(r):
    rad = r.randint(2, 25)
    return f"What is the area of a circle with a radius of {rad} cm? Use 3.14 for pi.", f"{3.14 * rad * rad:.2f} cm²"


def _m_sequence(r):
    if r.random() < 0.5:
        a, d = r.randint(-10, 30), r.randint(2, 12)
        seq = [a + d * i for i in range(5)]
        nxt = a + 5 * d
    else:
        a, q = r.randint(1, 5), r.choice([2, 3])
        seq = [a * q ** i for i in range(5)]
        nxt = a * q ** 5
    return f"What is the next number in the sequence {', '.join(map(str, seq))}, ...?", str(nxt)


def _m_gauss(r):
    n = r.randint(10, 500)
    return f"What is the sum of all the integers from 1 to {n}?", str(n * (n + 1) // 2)


def _m_growth(r):
    a = r.randint(20, 90) * 100
    b = a + r.randint(1, 40) * a // 100
    return f"A town's population grew from {a} to {b}. By what percentage did it grow?", f"{(b - a) / a * 100:.1f}%"


def _m_meeting(r):
    v1, v2, t = r.randint(40, 90), r.randint(40, 90), r.randint(1, 5)
    return (f"Two cars leave towns {(v1 + v2) * t} km apart at the same time and drive towards each other at {v1} "
            f"km/h and {v2} km/h. After how many hours do they meet?", f"{t} hours")


def _m_salary(r):
    s, rate = r.randint(20, 90) * 100, r.choice([10, 15, 20, 22, 25, 30])
    n = r.choice(NAMES)
    return f"{n} earns ${s} a month and pays {rate}% tax. How much does {n} take home in a year?", f"${_money(s * 12 * (100 - rate) / 100)}"


def _m_box(r):
    a, b, c = r.randint(10, 60), r.randint(10, 60), r.randint(10, 60)
    return f"A box measures {a} cm by {b} cm by {c} cm. What is its volume in litres?", f"{a * b * c / 1000:g} litres"


def _m_buses(r):
    import math

    a, b = r.choice([6, 8, 10, 12, 15, 20]), r.choice([9, 12, 14, 18, 25, 30])
    lcm = a * b // math.gcd(a, b)
    return (f"One bus route leaves the station every {a} minutes and another every {b} minutes. Both leave at 8:00. "
            "When do they next leave together?", f"{8 + lcm // 60}:{lcm % 60:02d}")


def _m_sum_diff(r):
    x, y = r.randint(5, 80), r.randint(1, 60)
    if y > x:
        x, y = y, x
    return f"The sum of two numbers is {x + y} and their difference is {x - y}. What are the numbers?", f"{x} and {y}"


def _m_tip(r):
    bill, n, rate = r.randint(30, 300), r.randint(2, 8), r.choice([10, 15, 18, 20])
    return (f"A dinner bill is ${bill}. {n} friends add a {rate}% tip and split the total equally. How much does "
            "each person pay?", f"${_money(bill * (1 + rate / 100) / n)}")


def _m_fuel(r):
    per, d, p = r.choice([5, 6, 6.5, 7, 8]), r.randint(50, 900), r.choice([1.5, 1.6, 1.8, 2.1])
    litres = per * d / 100
    return (f"A car uses {per} litres of fuel per 100 km. How much fuel does it need for a {d} km trip, and what "
            f"does that cost at ${p} per litre?", f"{litres:g} litres, ${_money(litres * p)}")


def _m_quadratic(r):
    a, b = r.randint(-9, 9), r.randint(-9, 9)
    s, p = a + b, a * b
    eq = f"x^2 {'-' if s >= 0 else '+'} {abs(s)}x {'+' if p >= 0 else '-'} {abs(p)} = 0"
    return f"Solve {eq}.", f"x = {min(a, b)} or x = {max(a, b)}"


def _m_mean_median(r):
    xs = sorted(r.randint(1, 50) for _ in range(r.choice([5, 6, 7])))
    shown = xs[:]
    r.shuffle(shown)
    n = len(xs)
    med = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return f"Find the mean and the median of {', '.join(map(str, shown))}.", f"mean {sum(xs) / n:.2f}, median {med:g}"


def _m_clock_angle(r):
    h, m = r.randint(1, 12), r.choice([0, 10, 15, 20, 30, 40, 45, 50])
    ang = abs(30 * (h % 12) - 5.5 * m)
    return f"What is the angle between the hour and minute hands of a clock at {h}:{m:02d}?", f"{min(ang, 360 - ang):g} degrees"


def _m_consecutive(r):
    x = r.randint(-20, 200)
    return f"The sum of three consecutive integers is {3 * x + 3}. What are they?", f"{x}, {x + 1}, {x + 2}"


def _m_expression(r):
    a, b, c, d = (r.randint(2, 20) for _ in range(4))
    expr = r.choice([f"{a} + {b} * {c} - {d}", f"({a} + {b}) * {c} - {d}", f"{a} * {b} - {c} * {d}",
                     f"{a * d} / {d} + {b} * {c}", f"{a}^2 - {b} * {c}"])
    return f"Evaluate {expr}.", f"{eval(expr.replace('^', '**')):g}"


def _m_savings(r):
    c, h, w = r.randint(150, 900), r.randint(10, 100), r.randint(10, 40)
    n = r.choice(NAMES)
    weeks = -(-(c - h) // w) if c > h else 0
    return (f"{n} wants a bike that costs ${c}. {n} has ${h} and saves ${w} a week. How many weeks until {n} can "
            "buy it?", f"{weeks} weeks")


def _m_pizza(r):
    from fractions import Fraction

    n = r.choice([8, 10, 12])
    a, b = r.randint(1, n // 2), r.randint(1, n // 2 - 1)
    n1, n2 = r.sample(NAMES, 2)
    return (f"A pizza has {n} slices. {n1} eats {a} and {n2} eats {b}. What fraction of the pizza is left?",
            str(Fraction(n - a - b, n)))


def _m_unit_price(r):
    a, pa, b, pb = r.randint(2, 8), r.randint(3, 12), r.randint(9, 20), r.randint(12, 30)
    better = "the small pack" if pa / a < pb / b else "the large pack"
    return (f"A pack of {a} batteries costs ${pa} and a pack of {b} costs ${pb}. Which is the better deal?",
            f"{better} (${pa / a:.2f} against ${pb / b:.2f} per battery)")


def _m_minutes(r):
    h, m = r.randint(1, 9), r.randint(1, 59)
    return f"How many minutes are there in {h} hours and {m} minutes?", str(60 * h + m)


MATH_TEMPLATES = {name[3:]: fn for name, fn in sorted(globals().items()) if name.startswith("_m_")}
MATH_FOLLOWUPS = ["Can you check that answer another way?", "Explain the second step in more detail.",
                  "Can you write that as a single equation?", "Make up a similar problem for me to practise.",
                  "Why does that method work?", "What would change if the numbers were doubled?",
                  "I got a different answer. Can you go through it again?", "Can you explain it more simply?"]
CODE_FOLLOWUPS = ["Can you add type hints?", "Write a few unit tests for it.", "How would I write this in {lang}?",
                  "What is its time complexity?", "Can you make it shorter?", "How does it handle edge cases?",
                  "Can you add comments explaining each step?", "Is there a faster way to do this?",
                  "Can you give an example of calling it?", "What happens if the input is empty?"]
DOC_FOLLOWUPS = ["Can you give me an example?", "Explain that more simply.", "When would I not want to use it?",
                 "Can you show the same thing in a complete, runnable script?", "What are the common pitfalls?",
                 "How does this compare to other ways of doing it?", "Summarize that in one sentence."]
CLARIFY_CHOICES = ["How it works, please.", "The history, mostly.", "Practical uses.", "All three, briefly.",
                   "Just the basics. I'm a beginner.", "The most surprising parts."]
PASSAGE_FOLLOWUPS = ["Now translate your summary into {tl}.", "Can you make it even shorter?",
                     "What is the tone of the original passage?", "Which line of the passage matters most, and why?",
                     "Rewrite your summary for a child.", "What might happen next?", "Who do you think wrote this, and when?",
                     "Explain the hardest sentence in the passage."]
TRANSLATE_TO = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese", "Russian", "Polish"]
SUMMARY_ASKS = ["Summarize this passage in one sentence:", "Summarize the following text in three bullet points.",
                "Give me a short summary of this:", "TL;DR this please:", "Summarize the passage below for a twelve-year-old.",
                "What is the main idea of this passage?", "Sum up this text in a few words."]
REWRITE_ASKS = ["Rewrite this passage in plain modern English:", "Rewrite the following as a short news report:",
                "Paraphrase this passage:", "Make this passage more concise:", "Rewrite this text in a more formal tone:",
                "Turn this passage into a short dialogue between two people:", "Rewrite this as a modern text message:",
                "Continue this passage in the same style:"]
TRANSLATE_ASKS = ["Translate this passage into {tl}:", "How would you say this in {tl}?",
                  "Translate the following text to {tl}, keeping the tone:", "Can you translate this to {tl}?"]
QA_ASKS = ["Who is speaking in this passage, and to whom?", "What is the mood of this passage?",
           "List the people mentioned in this passage.", "Explain any difficult words in this passage.",
           "What themes does this passage touch on?", "Write three comprehension questions about this passage, with answers.",
           "What happens in this passage?", "What does this passage suggest about the narrator or speaker?",
           "Is there any figurative language in this passage? Point it out."]
DOC_ASKS = ["What is this paragraph of Python documentation saying?", "Give a short Python example that illustrates this:",
            "Explain this to someone new to Python:", "Turn this documentation into a list of key points.",
            "Is there anything surprising in this documentation? Explain.", "Summarize this documentation paragraph:"]
PERSONAS = ["a high-school student", "a retired engineer", "a nurse", "a small-business owner", "a curious child",
            "a software developer", "a history teacher", "a first-time home buyer", "a university student", "a chef"]


# ---------------------------------------------------------------------------------------- corpus units

@dataclass(frozen=True)
class Function:
    name: str        # qualified name: func or Class.method
    source: str      # dedented source, decorators included
    doc: str         # docstring ("" when none)
    signature: str   # "name(args)"


def _chunks(text: str):
    """Top-level blocks of concatenated Python source that start with def / class / a decorator."""
    lines = text.split("\n")
    start, after_decorator = None, False
    for i, line in enumerate(lines):
        if not line or line[0].isspace() or line.startswith(("#", ")", "]", "}")):
            continue
        if start is not None and not after_decorator:
            yield "\n".join(lines[start:i]).rstrip() + "\n"
            start = None
        if start is None and line.startswith(("def ", "class ", "async def ", "@")):
            start = i
        after_decorator = line.startswith("@")
    if start is not None:
        yield "\n".join(lines[start:]).rstrip() + "\n"


def _strip_docstring(node: ast.AST) -> ast.AST:
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        node.body = body[1:] or [ast.Pass()]
    return node


def stdlib_functions(text: str) -> list[Function]:
    """Functions and methods of the stdlib source (`pystdlib.txt`), read with `ast` chunk by chunk."""
    out: dict[tuple[str, str], Function] = {}
    for chunk in _chunks(text):
        if len(chunk) > 60_000:
            continue
        try:
            tree = ast.parse(chunk)
        except (SyntaxError, ValueError):
            continue
        lines = chunk.split("\n")
        nodes = []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                nodes.append((node.name, node))
            elif isinstance(node, ast.ClassDef):
                nodes += [(f"{node.name}.{n.name}", n) for n in node.body
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for name, node in nodes:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            source = textwrap.dedent("\n".join(lines[first - 1: node.end_lineno])).strip("\n")
            if not 120 <= len(source) <= MAX_CODE_CHARS or "\t" in source:
                continue
            args = ast.unparse(node.args) if hasattr(ast, "unparse") else ""
            fn = Function(name, source, ast.get_docstring(node) or "", f"{node.name}({args})")
            out.setdefault((name, source), fn)
    return list(out.values())


def doc_paragraphs(text: str) -> list[str]:
    """Prose paragraphs of the reST docs, roles simplified (:func:`x` -> `x`)."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        if not 150 <= len(block) <= 900 or block[:1].isspace() or block.lstrip()[:1] in ".:*-=#|+" \
                or not block[:1].isalpha() or "::" in block[-4:]:
            continue
        lines = block.split("\n")
        if any(re.fullmatch(r"[=\-~^*]{3,}", ln.strip()) for ln in lines):
            continue
        para = " ".join(ln.strip() for ln in lines)
        para = re.sub(r":[\w:.-]+:`~?!?([^`<]+?)(?:\s*<[^>]*>)?`", r"`\1`", para)
        para = para.replace("``", "`")
        if sum(c.isalpha() for c in para) > 0.6 * len(para):
            out.append(para)
    return out


def doc_sections(text: str) -> list[tuple[str, str]]:
    """(section title, its first prose paragraph) pairs of the reST docs."""
    out = []
    blocks = re.split(r"\n\s*\n", text)
    for i, block in enumerate(blocks[:-1]):
        lines = block.strip().split("\n")
        if len(lines) >= 2 and re.fullmatch(r"[=\-~^]{3,}", lines[-1].strip()) and 3 <= len(lines[-2].strip()) < 50:
            title = lines[-2].strip()
            if title[0] in ":.*" or not re.search("[A-Za-z]", title):
                continue
            for nxt in blocks[i + 1: i + 4]:
                paras = doc_paragraphs(nxt)
                if paras:
                    out.append((title, paras[0]))
                    break
    return out


def first_sentence(text: str, limit: int = 220) -> str:
    text = " ".join(text.split())
    m = re.search(r"(.+?[.!?])(\s|$)", text)
    s = m.group(1) if m else text
    return s if len(s) <= limit else s[:limit].rsplit(" ", 1)[0] + "..."


@dataclass
class Pools:
    """Every source of one side ('train' or 'heldout')."""
    side: str
    literary: list[list[str]] = field(default_factory=list)  # per file, its blocks
    paragraphs: list[str] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    doc_titles: list[str] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    catalogue: dict[str, list] = field(default_factory=dict)


def text_blocks(text: str, size: int = TEXT_BLOCK_CHARS) -> list[str]:
    """Consecutive blocks of about `size` characters, cut at line ends: the units of the held-out
    split of the literary texts (an excerpt never leaves its block)."""
    out, at = [], 0
    while at < len(text):
        end = text.find("\n", at + size)
        end = len(text) if end < 0 else end + 1
        out.append(text[at:end])
        at = end
    return [b for b in out if b.strip()]


def build_pools(corpus: Path, fraction: float = 0.05) -> tuple[Pools, Pools]:
    """Both sides' sources. `fraction` of the literary blocks and of the docs paragraphs are held
    out (by a stable hash of their text, so they spread over every work and every part of the
    docs); docs section titles, stdlib functions and the catalogues are split by name."""
    texts = {f.name: f.read_text(encoding="utf-8", errors="replace") for f in sorted(corpus.glob("*.txt"))}
    if not texts:
        raise SystemExit(f"no corpus files (*.txt) in {corpus}; build it with shared/tools/build_corpus.sh")
    permille = round(1000 * fraction)
    train, held = Pools("train"), Pools("heldout")
    for name in LITERARY:
        if texts.get(name):
            blocks_train, blocks_held = split_names(text_blocks(texts[name]), str, permille)
            train.literary.append(blocks_train)
            held.literary.append(blocks_held)
    if texts.get("pydocs.txt"):
        docs = texts["pydocs.txt"]
        sections = doc_sections(docs)
        all_titles = sorted({t for t, _ in sections} | set(titles(docs)))
        train.doc_titles, held.doc_titles = split_names(all_titles, str, permille)
        held_titles = set(held.doc_titles)
        # a section's first paragraph goes with its title; the other paragraphs by their own hash
        held_first = {p for t, p in sections if t in held_titles}
        first = {p for _, p in sections}
        rest_train, rest_held = split_names([p for p in dict.fromkeys(doc_paragraphs(docs)) if p not in first], str,
                                            permille)
        held.paragraphs = rest_held + sorted(held_first)
        train.paragraphs = rest_train + sorted(first - held_first)
        train.sections = [(t, p) for t, p in sections if t not in held_titles and p not in held_first]
        held.sections = [(t, p) for t, p in sections if t in held_titles]
    if texts.get("pystdlib.txt"):
        functions = stdlib_functions(texts["pystdlib.txt"])
        train.functions, held.functions = split_names(functions, lambda f: f.name, HELDOUT_PERMILLE_NAMES)
        held_sources = {f.source for f in held.functions}
        train.functions = [f for f in train.functions if f.source not in held_sources]
    for key, items, keyfn in (("topics", TOPICS, str), ("subjects", SUBJECTS, str), ("pairs", PAIRS, lambda p: "|".join(p)),
                              ("tasks", CODE_TASKS, lambda t: t[0]), ("snippets", sorted(SNIPPETS), str),
                              ("sql", SQL_TASKS, lambda t: t[0]), ("shell", SHELL_TASKS, lambda t: t[0]),
                              ("math", sorted(MATH_TEMPLATES), str)):
        train.catalogue[key], held.catalogue[key] = split_names(list(items), keyfn)
    return train, held


# ---------------------------------------------------------------------------------------- generators

class Skip(Exception):
    """This generator has no source on this side (e.g. a corpus without that file)."""


def _pick(r: random.Random, items: list):
    if not items:
        raise Skip
    return r.choice(items)


def _passage(r: random.Random, pools: Pools, lo: int = 200, hi: int = 800) -> tuple[str, str]:
    """(text, source) of a literary excerpt or a docs paragraph."""
    files = [blocks for blocks in pools.literary if blocks]
    if files and (not pools.paragraphs or r.random() < 0.65):
        piece = excerpt(r.choice(r.choice(files)), r, r.randint(lo, hi))
        if len(piece) < 80:
            raise Skip
        return piece, "literary"
    return _pick(r, pools.paragraphs), "docs"


def _layout(r: random.Random, ask: str, body: str) -> str:
    style = r.randrange(6)
    if style == 0:
        return f"{body}\n\n{ask}"
    if style == 1:
        return f"{ask}\n\n\"\"\"\n{body}\n\"\"\""
    if style == 2:
        return f"Text:\n{body}\n\nTask: {ask}"
    if style == 3:
        return f"Here's a passage:\n\n{body}\n\n{ask}"
    return f"{ask}\n\n{body}"


def _code_block(lang: str, code: str) -> str:
    tag = {"C++": "cpp", "Bash": "bash"}.get(lang, lang.lower())
    return f"```{tag}\n{code}\n```"


def _preface(r: random.Random, ask: str) -> str:
    pre = r.choice(PREFACES)
    return pre + ask[:1].lower() + ask[1:] if pre and not ask.startswith("I") else ask


def _topic_chat(r, pools):
    t = _pick(r, pools.catalogue["topics"])
    ask = r.choice(TOPIC_ASKS).format(t=t)
    return _preface(r, ask) + r.choice(MODIFIERS), "topic", f"topic:{t}"


def _creative_chat(r, pools):
    s = _pick(r, pools.catalogue["subjects"])
    return r.choice(CREATIVE_ASKS).format(f=r.choice(FORMS), s=s, o=r.choice(OCCASIONS)), "creative", f"subject:{s}"


def _practical_chat(r, pools):
    return _preface(r, r.choice(PRACTICAL)(r)) + r.choice(MODIFIERS), "practical", "practical"


def _compare_chat(r, pools):
    a, b = _pick(r, pools.catalogue["pairs"])
    if r.random() < 0.5:
        a, b = b, a
    ask = r.choice(COMPARE_ASKS).format(a=a, b=b, A=a[:1].upper() + a[1:])
    return _preface(r, ask) + r.choice(MODIFIERS), "compare", f"pair:{'|'.join(sorted((a, b)))}"


def _python_chat(r, pools):
    if pools.doc_titles and (r.random() < 0.5 or not pools.functions):
        t = r.choice(pools.doc_titles)
        return r.choice(PY_TITLE_ASKS).format(t=t), "python-docs", f"title:{t}"
    f = _pick(r, [f for f in pools.functions if not f.name.startswith("_") and "." not in f.name] or pools.functions)
    return r.choice(PY_NAME_ASKS).format(n=f.name) + r.choice(MODIFIERS), "python-name", f"function:{f.name}"


CHAT = [(_topic_chat, 0.33), (_creative_chat, 0.17), (_practical_chat, 0.22), (_compare_chat, 0.1), (_python_chat, 0.18)]


def _weighted(r: random.Random, options: list[tuple[Callable, float]]):
    x, acc = r.random() * sum(w for _, w in options), 0.0
    for fn, w in options:
        acc += w
        if x < acc:
            return fn
    return options[-1][0]


def gen_chat(r, pools):
    text, task, source = _weighted(r, CHAT)(r, pools)
    return [{"role": "user", "content": text}], task, source


def _mutate(source: str, r: random.Random) -> str | None:
    """The function with one plausible bug (a flipped comparison, operator or constant), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    flips = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
             ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
    sites = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sites += [("cmp", node, i) for i, op in enumerate(node.ops) if type(op) in flips]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            sites.append(("binop", node, 0))
        elif isinstance(node, ast.BoolOp):
            sites.append(("bool", node, 0))
        elif isinstance(node, ast.Constant) and type(node.value) is int and 0 < node.value < 100:
            sites.append(("const", node, 0))
    if not sites:
        return None
    kind, node, i = r.choice(sites)
    if kind == "cmp":
        node.ops[i] = flips[type(node.ops[i])]()
    elif kind == "binop":
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
    elif kind == "bool":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    else:
        node.value += 1
    try:
        return ast.unparse(tree)
    except Exception:  # noqa: BLE001 - an exotic node ast.unparse cannot write back
        return None


def _doc_clause(doc: str) -> str | None:
    s = first_sentence(doc, 200)
    if len(s) < 15 or not s[0].isalpha() or s.endswith("..."):
        return None
    return s[0].lower() + s[1:] if not s[:2].isupper() else s


def _python_code(r, pools):
    f = _pick(r, pools.functions)
    mode = r.random()
    src = f.source
    if mode < 0.22:
        clause = _doc_clause(f.doc)
        if clause:
            sig = f.signature if len(f.signature) < 90 else f.signature.split("(")[0]
            return r.choice(PY_WRITE_ASKS).format(sig=sig, name=f.signature.split("(")[0], doc=clause), "py-write", f.name
    if mode < 0.34:
        lines = src.split("\n")
        if len(lines) >= 6:
            cut = max(2, int(len(lines) * r.uniform(0.3, 0.6)))
            return f"{r.choice(PY_COMPLETE_ASKS)}\n\n```python\n" + "\n".join(lines[:cut]) + "\n```", "py-complete", f.name
    if mode < 0.48:
        bug = _mutate(src, r)
        if bug and bug.strip() != src.strip():
            return f"{r.choice(PY_FIX_ASKS)}\n\n```python\n{bug}\n```", "py-fix", f.name
    if mode < 0.56:
        lang = r.choice(PY_TRANSLATE_TO)
        return f"Translate this Python function into {lang}:\n\n```python\n{src}\n```", "py-translate", f.name
    task, ask = r.choice(PY_SOURCE_ASKS)
    if task == "docstring" or (task == "explain" and r.random() < 0.5):
        try:
            src = ast.unparse(_strip_docstring(ast.parse(src).body[0]))
        except Exception:  # noqa: BLE001
            pass
    if r.random() < 0.3:
        return f"```python\n{src}\n```\n\n{ask}", f"py-{task}", f.name
    return f"{ask}\n\n```python\n{src}\n```", f"py-{task}", f.name


def _fill(r: random.Random, text: str) -> str:
    return text.format(n=r.randint(10, 100), k=r.randint(2, 10), year=r.randint(2015, 2025),
                       country=r.choice(["France", "Brazil", "Japan", "Canada", "Kenya", "India"]),
                       dir=r.choice(["/var/log", "~/Downloads", "/srv/data", "the current directory"]),
                       ext=r.choice(["py", "txt", "md", "js", "log", "csv"]), port=r.choice([3000, 5432, 8000, 8080]))


def _templated_code(r, pools):
    roll = r.random()
    if roll < 0.58:
        tid, desc = _pick(r, pools.catalogue["tasks"])
        lang = r.choices(LANGS, LANG_WEIGHTS)[0]
        ask = r.choice(WRITE_ASKS).format(lang=lang, d=_fill(r, desc)) + r.choice(CODE_MODIFIERS)
        return ask, f"write-{lang.lower()}", f"task:{tid}"
    if roll < 0.76:
        tid, desc = _pick(r, pools.catalogue["sql"])
        t = _fill(r, desc)
        return r.choice(SQL_ASKS).format(t=t, schema=SCHEMA) + r.choice(SQL_MODIFIERS), "sql", f"task:{tid}"
    if roll < 0.94:
        tid, desc = _pick(r, pools.catalogue["shell"])
        return r.choice(SHELL_ASKS).format(t=_fill(r, desc)) + r.choice(SHELL_MODIFIERS), "shell", f"task:{tid}"
    sid = _pick(r, pools.catalogue["snippets"])
    lang, good, bad = SNIPPETS[sid]
    mod = r.choice(SHELL_MODIFIERS[:4])
    if r.random() < 0.5:
        return (f"{r.choice(FIX_ASKS).format(lang=lang)}{mod}\n\n{_code_block(lang, bad)}", f"fix-{lang.lower()}",
                f"snippet:{sid}")
    return (f"{r.choice(SNIPPET_ASKS).format(lang=lang)}{mod}\n\n{_code_block(lang, good)}", f"explain-{lang.lower()}",
            f"snippet:{sid}")


def gen_code(r, pools):
    if pools.functions and r.random() < 0.6:
        text, task, name = _python_code(r, pools)
        return [{"role": "user", "content": text}], task, f"function:{name}"
    text, task, source = _templated_code(r, pools)
    return [{"role": "user", "content": text}], task, source


def _math_problem(r, pools):
    name = _pick(r, pools.catalogue["math"])
    question, answer = MATH_TEMPLATES[name](r)
    return question, answer, name


def gen_math(r, pools):
    q, _, name = _math_problem(r, pools)
    return [{"role": "user", "content": r.choice(MATH_PREFIXES) + q + r.choice(MATH_SUFFIXES)}], name, f"math:{name}"


def gen_passage(r, pools):
    body, where = _passage(r, pools)
    if where == "docs" and r.random() < 0.5:
        ask, task = r.choice(DOC_ASKS), "docs"
    else:
        task = r.choice(["summarize", "summarize", "rewrite", "translate", "qa", "qa"])
        ask = r.choice({"summarize": SUMMARY_ASKS, "rewrite": REWRITE_ASKS, "translate": TRANSLATE_ASKS,
                        "qa": QA_ASKS}[task]).format(tl=r.choice(TRANSLATE_TO))
    return [{"role": "user", "content": _layout(r, ask, body)}], f"{task}-{where}", f"passage:{where}"


def _mt_math(r, pools):
    q, answer, name = _math_problem(r, pools)
    reply = r.choice(["Let's work it out step by step. The answer is {a}.", "The answer is {a}.",
                      "Working through the numbers gives {a}.", "Sure! {a}."]).format(a=answer)
    return [q, reply, r.choice(MATH_FOLLOWUPS)], "math", f"math:{name}"


def _mt_code(r, pools):
    f = _pick(r, pools.functions)
    clause = _doc_clause(f.doc)
    follow = r.choice(CODE_FOLLOWUPS).format(lang=r.choice(PY_TRANSLATE_TO))
    if clause and r.random() < 0.6:
        user = f"Write a Python function that {clause}"
        reply = f"Here is one way to write it:\n\n```python\n{f.source}\n```"
    else:
        user = f"What does this function do?\n\n```python\n{f.source}\n```"
        reply = (f"`{f.signature.split('(')[0]}` {clause}" if clause else
                 f"It defines `{f.signature.split('(')[0]}`. Would you like a line-by-line explanation?")
    return [user, reply, follow], "code", f"function:{f.name}"


def _mt_docs(r, pools):
    title, para = _pick(r, pools.sections)
    return [r.choice(PY_TITLE_ASKS).format(t=title), para, r.choice(DOC_FOLLOWUPS)], "docs", f"title:{title}"


def _mt_clarify(r, pools):
    t = _pick(r, pools.catalogue["topics"])
    opener = r.choice(["Tell me about {t}.", "I want to learn about {t}.", "Can we talk about {t}?", "{T}?"])
    reply = r.choice(["Happy to! {T} is a big subject. Are you more interested in how it works, its history, or its "
                      "practical uses?", "Sure. What would you like to know about {t}? I can cover the basics, the "
                      "history or the practical side."])
    fill = {"t": t, "T": t[:1].upper() + t[1:]}
    return [opener.format(**fill), reply.format(**fill), r.choice(CLARIFY_CHOICES)], "clarify", f"topic:{t}"


def _summary_sentence(body: str) -> str:
    """The first sentence of at least 40 characters (an excerpt may start mid-sentence)."""
    text = " ".join(body.split())
    for m in re.finditer(r"[^.!?;]+[.!?;]", text):
        sentence = m.group(0).strip()
        if len(sentence) >= 40:
            return sentence if len(sentence) <= 220 else sentence[:220].rsplit(" ", 1)[0] + "..."
    return first_sentence(text, 220)


def _mt_passage(r, pools):
    body, where = _passage(r, pools, 200, 600)
    user = _layout(r, r.choice(SUMMARY_ASKS), body)
    reply = "In short: " + _summary_sentence(body)
    follow = r.choice(PASSAGE_FOLLOWUPS).format(tl=r.choice(TRANSLATE_TO))
    return [user, reply, follow], f"passage-{where}", f"passage:{where}"


MULTI = [(_mt_math, 0.2), (_mt_code, 0.3), (_mt_docs, 0.15), (_mt_clarify, 0.15), (_mt_passage, 0.2)]


def gen_multi(r, pools):
    (user, reply, follow), task, source = _weighted(r, MULTI)(r, pools)
    return ([{"role": "user", "content": user}, {"role": "assistant", "content": reply},
             {"role": "user", "content": follow}], f"mt-{task}", source)


def gen_propose(r, pools):
    roll = r.random()
    if roll < 0.4:
        t = _pick(r, pools.catalogue["topics"])
        text = (f"Propose one question that {r.choice(PERSONAS)} might ask an AI assistant about {t}. "
                "Reply with the question only.")
        return [{"role": "user", "content": text}], "propose-topic", f"topic:{t}"
    if roll < 0.7:
        lang = r.choices(LANGS, LANG_WEIGHTS)[0]
        about = r.choice(["a bug", "performance", "a design question", "testing", "a library", "error messages",
                          "a beginner's question", "code review", "concurrency", "data structures"])
        text = (f"Write one realistic request about {about} that a programmer might send to a coding assistant, "
                f"in {lang}. Reply with the request only.")
        return [{"role": "user", "content": text}], "propose-code", "propose-code"
    if roll < 0.85:
        grade = r.choice(["fourth-grade", "middle-school", "high-school", "first-year university"])
        about = r.choice(["percentages", "fractions", "speed and distance", "money", "area and perimeter", "probability",
                          "ages", "time", "ratios", "averages", "unit conversion", "simple equations"])
        return [{"role": "user", "content": f"Write one math word problem about {about} for a {grade} student. "
                                            "State only the problem."}], \
            "propose-math", "propose-math"
    body, where = _passage(r, pools, 200, 500)
    text = f"Suggest one interesting question a reader could ask about this passage. Reply with the question only.\n\n{body}"
    return [{"role": "user", "content": text}], "propose-passage", f"passage:{where}"


GENERATORS = {"chat": gen_chat, "code": gen_code, "math": gen_math, "passage": gen_passage, "multi-turn": gen_multi,
              "propose": gen_propose}


def make_record(kind: str, r: random.Random, pools: Pools) -> dict | None:
    for _ in range(8):  # a generator whose source is missing on this side raises Skip: try again
        try:
            messages, task, source = GENERATORS[kind](r, pools)
        except Skip:
            continue
        if r.random() < 0.12 and kind != "propose":
            messages = [{"role": "system", "content": r.choice(SYSTEMS)}] + messages
        return {"messages": messages, "kind": kind, "task": task, "source": source}
    return None


def _train_kind(r: random.Random, kinds: tuple[str, ...]) -> str:
    weights = [TRAIN_WEIGHTS[k] for k in kinds]
    return r.choices(kinds, weights)[0]


def train_records(pools: Pools, seed: int, start: int, count: int, kinds: tuple[str, ...] = KINDS):
    """Records start..start+count of the training stream (record i depends only on seed and i);
    exact duplicates within the slice are dropped."""
    seen = set()
    for i in range(start, start + count):
        r = random.Random(f"{seed}:train:{i}")
        rec = make_record(_train_kind(r, kinds), r, pools)
        if rec is None:
            continue
        key = json.dumps(rec["messages"], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        yield rec


def heldout_records(pools: Pools, seed: int, per_kind: int, kinds: tuple[str, ...] = EVAL_KINDS) -> list[dict]:
    """`per_kind` distinct records of each kind, interleaved kind by kind (so the first N lines are balanced)."""
    by_kind: dict[str, list[dict]] = {}
    for kind in kinds:
        seen, out = set(), []
        for i in range(per_kind * 20):
            if len(out) == per_kind:
                break
            rec = make_record(kind, random.Random(f"{seed}:heldout:{kind}:{i}"), pools)
            if rec is None:
                continue
            key = json.dumps(rec["messages"], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(rec)
        by_kind[kind] = out
    return [by_kind[k][i] for i in range(per_kind) for k in kinds if i < len(by_kind[k])]


def prompt_texts(record: dict) -> str:
    return "\n".join(m["content"] for m in record["messages"])


# ---------------------------------------------------------------------------------------- proposals (second stage)

def proposals_to_records(responses: Path, target: Path) -> list[dict]:
    """The target's answers to `propose` prompts (a train-draft responses.jsonl) as new user prompts
    of kind `proposed`: the first line of each answer, unquoted, if it looks like a request."""
    from sglaunch.server.tokenizer import load_tokenizer
    from sglaunch.training.data import load_samples

    tok = load_tokenizer(target)
    out, seen = [], set()
    for s in load_samples(responses):
        if s.type != "propose":
            continue
        text = tok.decode(s.response, skip_special_tokens=True).strip()
        line = next((ln.strip() for ln in text.split("\n") if ln.strip()), "")
        line = re.sub(r"^(question|request|problem)\s*:\s*", "", line, flags=re.I).strip().strip('"\u201c\u201d')
        if 15 <= len(line) <= 400 and line not in seen:
            seen.add(line)
            out.append({"messages": [{"role": "user", "content": line}], "kind": "proposed", "task": "proposed",
                        "source": "proposed"})
    return out


# ---------------------------------------------------------------------------------------- CLI

def _write_jsonl(path: Path, rows, compress: bool) -> int:
    n = 0
    tmp = path.with_name(path.name + ".tmp")
    opener = (lambda: gzip.GzipFile(filename="", fileobj=open(tmp, "wb"), mode="wb", mtime=0)) if compress \
        else (lambda: open(tmp, "wb"))
    with opener() as handle:
        for row in rows:
            handle.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    tmp.replace(path)
    return n


def _corpus_manifest(corpus: Path) -> dict:
    return {f.name: {"bytes": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
            for f in sorted(corpus.glob("*.txt"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, nargs="?", help="folder written by shared/tools/build_corpus.sh")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.jsonl, heldout.jsonl, manifest.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-count", type=int, default=100_000, help="training records to draw (0: none)")
    parser.add_argument("--start", type=int, default=0, help="first record of the training stream (fresh slices per round)")
    parser.add_argument("--heldout-per-kind", type=int, default=150, help="held-out records per kind (0: none)")
    parser.add_argument("--heldout-fraction", type=float, default=0.05,
                        help="share of the literary blocks and docs paragraphs held out")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds of the training stream")
    parser.add_argument("--gzip", action="store_true", help="write train.jsonl.gz")
    parser.add_argument("--from-proposals", type=Path, metavar="RESPONSES",
                        help="instead: turn the target's answers to `propose` prompts (a train-draft responses.jsonl) "
                             "into OUT/proposed.jsonl; needs --target")
    parser.add_argument("--target", type=Path, help="the target whose tokenizer decodes --from-proposals")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_proposals:
        if not args.target:
            parser.error("--from-proposals needs --target")
        rows = proposals_to_records(args.from_proposals, args.target)
        n = _write_jsonl(args.out / "proposed.jsonl", rows, False)
        print(f"wrote {n} proposed prompts to {args.out / 'proposed.jsonl'}")
        return
    if args.corpus is None:
        parser.error("CORPUS_DIR is required")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    train, held = build_pools(args.corpus, args.heldout_fraction)
    manifest = {"seed": args.seed, "corpus": _corpus_manifest(args.corpus), "heldout_fraction": args.heldout_fraction,
                "pools": {side.side: {"literary_files": len(side.literary), "doc_paragraphs": len(side.paragraphs),
                                      "doc_sections": len(side.sections), "functions": len(side.functions),
                                      **{k: len(v) for k, v in side.catalogue.items()}} for side in (train, held)}}
    if args.heldout_per_kind > 0:
        rows = heldout_records(held, args.seed, args.heldout_per_kind)
        _write_jsonl(args.out / "heldout.jsonl", rows, False)
        counts: dict[str, int] = {}
        for row in rows:
            counts[row["kind"]] = counts.get(row["kind"], 0) + 1
        manifest["heldout"] = {"file": "heldout.jsonl", "records": len(rows), "per_kind": counts}
        print(f"wrote {len(rows)} held-out prompts to {args.out / 'heldout.jsonl'} ({counts})")
    if args.train_count > 0:
        counts = {}

        def counted():
            for row in train_records(train, args.seed, args.start, args.train_count, kinds):
                counts[row["kind"]] = counts.get(row["kind"], 0) + 1
                yield row

        name = "train.jsonl.gz" if args.gzip else "train.jsonl"
        n = _write_jsonl(args.out / name, counted(), args.gzip)
        manifest["train"] = {"file": name, "start": args.start, "drawn": args.train_count, "records": n,
                             "per_kind": counts, "kinds": list(kinds)}
        print(f"wrote {n} training prompts to {args.out / name} ({counts})")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
