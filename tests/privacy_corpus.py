"""Prompts with and without personal or secret data, shared by the detector's unit tests and the
end-to-end test that checks what reaches the loopback "cloud". All data is synthetic: test card
numbers, documentation IBANs and keys, reserved phone ranges."""

from __future__ import annotations

# (prompt, the kind it must be flagged as, the secret that must never leave the device)
SENSITIVE: list[tuple[str, str, str]] = [
    ("Write a polite reply to maria.gonzalez84@gmail.com about the delay.", "email",
     "maria.gonzalez84@gmail.com"),
    ("My card is 4111 1111 1111 1111, exp 12/27. Is it safe to shop online?", "card",
     "4111 1111 1111 1111"),
    ("Pay the invoice to IBAN DE89 3704 0044 0532 0130 00 and confirm.", "iban",
     "DE89 3704 0044 0532 0130 00"),
    ("Fill the form: name John Smith, SSN 123-45-6789, born 1980.", "ssn", "123-45-6789"),
    ("Call me back on +44 20 7946 0958 after six.", "phone", "+44 20 7946 0958"),
    ("Why does this fail? client = OpenAI(api_key='sk-proj-Xk29dLq8Zr7Wm3Np5Tv1Yb6Hc4Js0Fg')",
     "api_key", "sk-proj-Xk29dLq8Zr7Wm3Np5Tv1Yb6Hc4Js0Fg"),
    ("Is this AWS key id valid: AKIAZ7QW3ER5TY8UI2OP?", "api_key", "AKIAZ7QW3ER5TY8UI2OP"),
    ("Summarise this config:\n-----BEGIN OPENSSH PRIVATE KEY-----\n"
     "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
     "-----END OPENSSH PRIVATE KEY-----", "private_key",
     "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"),
    ("My national insurance number is JG 10 37 42 A, which form do I need?", "uk_nino",
     "JG 10 37 42 A"),
    ("Text my US number (212) 555-0187 when the order ships.", "phone", "(212) 555-0187"),
    # issue 31: a name with a UK mobile written with a space (libphonenumber's example range)
    ("Remind Jane Whitfield on 07400 123456 about Saturday's rota.", "phone", "07400 123456"),
]  # fmt: skip

# issue 31: identifiers given in pieces over a conversation, with words between the pieces
# (messages, the kind it must be flagged as, the pieces that must never leave the device)
SPLIT: list[tuple[list[dict[str, str]], str, tuple[str, ...]]] = [
    (
        [
            {"role": "user", "content": "Please update my contact details. My email starts "
                                        "with jane.doe, the usual format."},
            {"role": "assistant", "content": "Sure. What comes after that?"},
            {"role": "user", "content": "Sorry, I was interrupted. And it ends with @example.org."},
        ],
        "email", ("jane.doe", "@example.org"),
    ),
]  # fmt: skip

BENIGN: list[str] = [
    "Explain the difference between a list and a tuple in Python.",
    "Translate 'good morning, see you at 10:30' into French.",
    "What is 1234 * 5678? Show the steps.",
    "Solve 3x + 7 = 22 and then compute 2^10 - 1 = 1023.",
    "The meeting is on 2024-03-15 at 14:00 UTC, then again on 15/04/2024.",
    "Upgrade numpy from 1.26.4 to 2.0.1 and pin scipy>=1.13.0,<1.14.",
    "Fix this: color = 0xFF00FF; mask = 0xDEADBEEF & value",
    "Commit 3f786850e387550fdab836ed7e6dc881de23001b broke the build; bisect it.",
    "sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "Where is my order #123-456-7890? It was order number 20240315-00042.",
    "Reference ORD-2024-000123 shipped in 3 parcels weighing 1.25 kg each.",
    "Ping 192.168.100.200 and 10.0.0.1, then curl http://localhost:8080/api/v1/items?id=42",
    "The UUID is 123e4567-e89b-12d3-a456-426614174000; parse it.",
    "ISBN 978-0-306-40615-7 is a book about numbers.",
    "pi = 3.14159265358979 and e = 2.718281828459045 to 15 digits.",
    "Convert the timestamp 1700000000000 ms to a date.",
    "Write a regex for emails like user at example dot com, without using the at sign.",
    "git clone git@github.com:org/repo.git && cd repo && make test",
    "Decorators: @property, @staticmethod, @dataclass(frozen=True).",
    "In CSS, @media (max-width: 600px) { .a { margin: 0 4px 0 4px } }",
    "def token_count(text: str) -> int: return len(tokenizer.encode(text))",
    "api_key = os.environ['OPENAI_API_KEY']  # read the key from the environment",
    "password = getpass.getpass('Password: ')",
    "Set OPENAI_API_KEY=your_api_key_here in the .env file.",
    "The population grew from 1,234,567 to 2,345,678 between 1990 and 2020.",
    "Prices: $1,299.99, EUR 849.00, and 12 500 yen.",
    "Matrix [[1, 2, 3], [4, 5, 6]] times vector (7, 8, 9).",
    "for i in range(1000000): total += i * 31 % 1000000007",
    "Write a haiku about autumn leaves falling on a quiet pond.",
    "Summarise the plot of Hamlet in three sentences.",
    "Call the function at line 1024 of file main.c, version 2.4.1-rc3.",
    "Latitude 48.8566, longitude 2.3522 is Paris.",
    "The secret to good bread is time and a hot oven.",
    "Use tokens wisely: the model has a 4096 token context.",
    "Phone cases come in 3 sizes: 5.4, 6.1 and 6.7 inches.",
    "Error code 0x80070005 means access denied on Windows.",
    "Run docker run -p 8080:80 nginx:1.25.3-alpine",
    "MD5 of 'hello' is 5d41402abc4b2a76b9719d911017c592.",
    "Base64 of 'hello world' is aGVsbG8gd29ybGQ=.",
    "The year 2023 had 365 days, 52 weeks and 1 day.",
    "Compute 16 digits of 1/7: 0.1428571428571428",
    "npm install @types/node@20.11.5 --save-dev",
    "Card games: which is older, bridge or poker?",
    "Describe the IBAN format in general terms, without a real example.",
    "Track 1Z999AA10123456784 is a UPS-style tracking number.",
]

# issue 31: plain questions about public figures, with nothing private in them: they go where the
# policy sends them (the NER layer drops a public figure's name, `guard.privacy_public`)
PUBLIC: list[str] = [
    "Who was Abraham Lincoln and why was he important?",
    "Summarise Albert Einstein's contributions to physics.",
    "Why did Napoleon Bonaparte invade Russia in 1812?",
    "What did Marie Curie discover?",
    "Qui était Victor Hugo et pourquoi est-il célèbre ?",
    "Compare the leadership styles of Winston Churchill and Franklin D. Roosevelt.",
]
