"""`hybridllm.tools.fit`: the share of a tool name's content words the request states."""

from __future__ import annotations

import pytest

from hybridllm.tools.fit import question_of, tool_fit


@pytest.mark.parametrize(
    ("question", "name", "fit"),
    [
        ("Find the area of a triangle with base 10 and height 5", "calculate_triangle_area", 1.0),
        ("Calculate the greatest common divisor of 40 and 50", "math_gcd", 0.5),  # "math" unsaid
        ("Calculate the greatest common divisor of 40 and 50", "calculate_gcd", 1.0),  # initials
        ("What are the roots of x^2 - 4?", "findRoots", 1.0),  # camelCase, a plural
        ("Integrate x^2 from 1 to 3", "integral.compute", 1.0),  # the same stem
        ("What is the perimeter of a rectangle?", "solve_quadratic_equation", 0.0),
        ("Find the integral of x^3 from 1 to 5", "str_to_int", 0.0),  # "int" is no stem of it
        ("What's the weather in Paris?", "get_info", 1.0),  # nothing in the name to judge
        ("Calculate body mass index for 80 kg and 1.8 m", "calculate_bmi", 1.0),
        ("Calculate the area of a triangle, base 10, height 5", "determine_body_mass_index", 0.0),
    ],
)
def test_the_fit_is_the_share_of_the_name_words_the_question_states(
    question: str, name: str, fit: float
) -> None:
    assert tool_fit(question, name) == fit


def test_the_question_is_the_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "You set timers."},
        {"role": "user", "content": "a timer for tea"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    assert question_of(messages) == "a timer for tea"
    assert question_of([{"role": "system", "content": "hi"}]) == ""
