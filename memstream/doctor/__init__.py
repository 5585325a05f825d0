"""`memstream doctor`: a module per group of set-up checks (store: SQLite and the database; models: the model
server; discord: the bot's application and servers), the Check each gives (checks), and the report that runs
them in order (report). Importing it loads SQLite, the openai SDK and aiohttp: the command line imports it only
when doctor runs."""

from memstream.doctor.checks import Check, Status
from memstream.doctor.report import run_doctor

__all__ = ["Check", "Status", "run_doctor"]
