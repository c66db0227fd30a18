from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard import services


class Command(BaseCommand):
    help = "Create an operator (or --reset the password of an existing user) and print a one-time password."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--reset", action="store_true", help="give an existing user a new one-time password")
        parser.add_argument("--role", choices=["operator", "viewer"], default="operator")

    def handle(self, *args, username, reset, role, **options):
        User = get_user_model()
        existing = User.objects.filter(username=username).first()
        if reset:
            if existing is None:
                raise CommandError(f"No user named {username!r}. Leave out --reset to create one.")
            password = services.account_reset_password(user=existing)
        else:
            if existing is not None:
                raise CommandError(f"A user named {username!r} already exists. Add --reset to give them a new password.")
            _, password = services.account_create(username=username, role=role)
        self.stdout.write(f"{username}: one-time password {password} (they choose their own at first sign-in)")
