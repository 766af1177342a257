"""A one-model Django app for tests/integration/test_frameworks.py: the small Django project
whose transaction pgworkerd.contrib.django enqueues in."""
