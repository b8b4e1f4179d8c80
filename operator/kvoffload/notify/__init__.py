"""Notifications: a policy's transitions told to the cluster admin's webhook sinks.

``derive`` (pure) finds what a cycle's status write decided that a person wants to hear of; ``payload``
turns it into the documented JSON, a Slack message, an Alertmanager alert or an Apprise text; ``sink`` delivers
to one sink from a bounded queue in a thread of its own, with retries (``via_apprise`` for Apprise's services);
``notifier`` holds the admin's sinks by name (``config``).
"""
