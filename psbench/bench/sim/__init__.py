"""The scale models: the event model (events.py, costs measured from the suites' records) and the
analytic model (analytic.py, closed form), each checked against measured runs and projected."""
