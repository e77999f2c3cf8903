"""What the tests' stdlib loopback HTTP servers share."""

# `serve_forever`'s poll interval: `shutdown()` waits up to one of them for the loop to see it.
# The default (0.5 s) made every test with such a server half a second longer in its teardown.
POLL_S = 0.01
