"""The D-Bus edge: names, the io.rdmad1 service, caller credentials.

The API it serves is documented in docs/dbus-api.md and dbus/*.xml."""
