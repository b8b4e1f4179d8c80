"""Notifications: a policy's transitions told to the cluster admin's webhook sinks.

``derive`` (pure) finds what a cycle's status write decided that a person wants to hear of; ``payload``
turns it into the documented JSON or a Slack message; ``sink`` delivers to one webhook from a bounded queue
in a thread of its own, with retries; ``notifier`` holds the admin's sinks by name (``config``).
"""
