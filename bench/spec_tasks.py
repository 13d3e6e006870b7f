"""The held-out tasks of scripts/bench_spec_auto.py: four kinds a local
model is asked to do, three or four of each. None of them was used to
choose adaptive speculation's constants. Free text and chat answers repeat
little of their prompt; edits and answers from a document repeat a lot."""

from __future__ import annotations

EVENS = '''def evens(xs):
    out = []
    for x in xs:
        if x % 2 == 0:
            out.append(x)
    return out


def squares(xs):
    out = []
    for x in xs:
        out.append(x * x)
    return out
'''

INVENTORY = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError(f"only {have} of {name} left")
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())
'''

CART = '''function cartTotal(cart, taxRate) {
  let sum = 0;
  for (const item of cart.items) {
    if (item.quantity <= 0) {
      continue;
    }
    sum += item.price * item.quantity;
  }
  if (cart.coupon && cart.coupon.percent) {
    sum = sum * (1 - cart.coupon.percent / 100);
  }
  const tax = sum * taxRate;
  return Math.round((sum + tax) * 100) / 100;
}
'''

CONFIG = '''import json
import os


def load_settings(path):
    with open(path) as f:
        data = json.load(f)
    host = data.get("host", "localhost")
    port = int(data.get("port", 8080))
    debug = bool(data.get("debug", False))
    workers = int(data.get("workers", os.cpu_count() or 1))
    return {"host": host, "port": port, "debug": debug, "workers": workers}
'''

INSTALL_GUIDE = """Installing the Harbor backup agent

Harbor runs on Linux and macOS. Before you start, make sure the machine has at least 2 GB of
free disk space and that port 7421 is open for outgoing connections.

Step 1. Download the installer from the Harbor console under Settings > Agents. The file is
called harbor-agent-setup.sh and is about 40 MB.
Step 2. Run the installer as root: sudo sh harbor-agent-setup.sh --token YOUR_TOKEN. The token
is shown next to the download link and expires after 24 hours.
Step 3. The installer creates a service named harbor-agent. Start it with
sudo systemctl start harbor-agent, and enable it at boot with sudo systemctl enable harbor-agent.
Step 4. Open the console and check that the machine appears under Agents with the status
Connected. This can take up to five minutes.
Step 5. Choose the folders to back up under Policies. By default Harbor backs up /etc and /home
every night at 02:00 and keeps 30 daily copies.

If the agent does not connect, check the log file at /var/log/harbor/agent.log. The most common
causes are an expired token and a firewall that blocks port 7421. To uninstall, run
sudo harbor-agent --uninstall, which removes the service but keeps the backups already stored.
"""

MEETING = """Minutes of the platform team meeting, 14 March

Present: Ana, Bruno, Chen, Dara. Chair: Ana.

1. Release 4.2. Bruno reported that the release candidate passed all tests except the upgrade
test on PostgreSQL 12. The team decided to drop support for PostgreSQL 12 in 4.2 and to say so
in the release notes. The release date stays 28 March.
2. On-call. Chen proposed moving from weekly to two-week on-call rotations. Dara objected that
two weeks is too long for one person. The team decided to keep weekly rotations and to add a
secondary on-call person from April.
3. Budget. Ana said the cloud bill grew 18 percent in February, mostly from test environments
that were never shut down. The team decided that test environments will stop automatically
after 8 hours, starting next Monday. Bruno will write the script.
4. Hiring. Two candidates reached the final round. Dara will send the feedback by Friday.

Action items: Bruno writes the shutdown script by Monday. Chen updates the on-call schedule.
Dara sends hiring feedback by Friday. Ana drafts the 4.2 release notes.
"""

POLICY = """Refunds and returns

You can return any item within 30 days of delivery for a full refund, as long as it is unused
and in its original packaging. Items bought on sale can be returned within 14 days. Gift cards,
downloadable software and personalised items cannot be returned.

To start a return, open your order in your account and choose Return items. We email you a
prepaid shipping label within one business day. Returns from outside the country are not
covered by the prepaid label, and their shipping cost is not refunded.

Once the item reaches our warehouse, we inspect it within three business days. If it passes
inspection, we refund the original payment method. Card refunds take five to ten business days
to appear on your statement. If the item is damaged on arrival, contact support within 48
hours with a photo, and we send a replacement at no cost instead of a refund.
"""

# (kind, name, prompt)
TASKS: list[tuple[str, str, str]] = [
    ("free", "lighthouse", "Write a story of about 300 words about a lighthouse keeper who "
                           "finds a message in a bottle."),
    ("free", "autumn", "Describe a walk through a forest in autumn, in three paragraphs."),
    ("free", "bottle", "Write a detailed product description, of about 250 words, for a "
                       "reusable steel water bottle."),
    ("chat", "tcp-udp", "What are the main differences between TCP and UDP? Explain each "
                        "difference in a short paragraph."),
    ("chat", "photosynthesis", "How does photosynthesis work? Explain each stage in a few "
                               "sentences."),
    ("chat", "decorator", "What is a Python decorator? Explain how it works step by step, with "
                          "two examples."),
    ("edit", "comprehensions", "Rewrite this Python code to use list comprehensions. Reply with "
                               "the code only.\n\n" + EVENS),
    ("edit", "inventory", "Add type hints to every method of this class, changing nothing "
                          "else. Reply with the code only.\n\n" + INVENTORY),
    ("edit", "cart", "Rename the variable `sum` to `subtotal` in this JavaScript function, "
                     "changing nothing else. Reply with the code only.\n\n" + CART),
    ("edit", "settings", "Add a docstring to this function and keep the code the same. Reply "
                         "with the code only.\n\n" + CONFIG),
    ("document", "install", INSTALL_GUIDE + "\nUsing only the document above, list the steps "
                                            "to install the agent, with the exact commands."),
    ("document", "meeting", MEETING + "\nUsing only the minutes above, list every decision the "
                                      "team made and every action item, with who does it."),
    ("document", "refunds", POLICY + "\nRewrite the policy above as a bulleted list, one "
                                     "bullet per sentence, keeping its wording."),
]
KINDS = ("free", "chat", "edit", "document")
