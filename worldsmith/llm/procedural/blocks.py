"""Building blocks of procedural worlds: entities with typed fields, a status machine, and
domains composed of entities. A scenario is mapped to the domain whose keywords it matches."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Field:
    """One column. `kind` picks the SQL type and the fake data: text, name, company, email, phone,
    address, city, sentence, title, word, url, date, int, money, bool, enum."""

    name: str
    kind: str
    choices: tuple[str, ...] = ()
    low: int = 0
    high: int = 1000
    editable: bool = False


@dataclass(frozen=True)
class Transition:
    action: str  # verb used as the tool prefix: approve -> approve_<entity>
    sources: tuple[str, ...]
    target: str
    phrase: str  # how a user asks for it: "approve"


@dataclass(frozen=True)
class Entity:
    """A table of the world. `parent` makes rows belong to a row of another entity (a foreign key)."""

    table: str
    singular: str
    fields: tuple[Field, ...]
    label: str | None = None  # unique, human-readable column used for lookups
    parent: str | None = None  # table name of the parent entity
    statuses: tuple[str, ...] = ()
    transitions: tuple[Transition, ...] = ()
    creatable: bool = False
    extra_parent: str | None = None  # a second foreign key (e.g. order -> product)

    @property
    def terminal(self) -> set[str]:
        moving = {s for t in self.transitions for s in t.sources}
        return set(self.statuses) - moving


@dataclass(frozen=True)
class Domain:
    key: str
    title: str
    keywords: tuple[str, ...]
    entities: tuple[Entity, ...] = field(default_factory=tuple)


def T(action: str, sources: str, target: str, phrase: str | None = None) -> Transition:
    return Transition(action, tuple(sources.split()), target, phrase or action.replace("_", " "))


def F(name: str, kind: str, *choices: str, low: int = 0, high: int = 1000, editable: bool = False) -> Field:
    return Field(name, kind, tuple(choices), low, high, editable)


DOMAINS: tuple[Domain, ...] = (
    Domain("retail", "Online store", ("shop", "store", "commerce", "retail", "marketplace", "buy", "product", "cart", "seller", "purchase", "warehouse", "furniture", "hardware", "electronics", "wholesale"), (
        Entity("customers", "customer", (F("full_name", "name"), F("email", "email", editable=True), F("tier", "enum", "basic", "plus", "premium", editable=True)), label="full_name"),
        Entity("products", "product", (F("title", "title"), F("category", "enum", "home", "garden", "electronics", "toys", "books"), F("price_cents", "money", low=199, high=99999, editable=True), F("stock", "int", low=0, high=200)), label="title",
               statuses=("active", "discontinued"), transitions=(T("discontinue", "active", "discontinued"), T("reactivate", "discontinued", "active"))),
        Entity("orders", "order", (F("shipping_address", "address", editable=True), F("total_cents", "money", low=500, high=250000), F("placed_on", "date")), parent="customers",
               statuses=("pending", "paid", "shipped", "delivered", "cancelled"), creatable=True,
               transitions=(T("pay", "pending", "paid"), T("ship", "paid", "shipped"), T("mark_delivered", "shipped", "delivered", "mark as delivered"), T("cancel", "pending paid", "cancelled"))),
        Entity("returns", "return request", (F("reason", "sentence"), F("refund_cents", "money", low=100, high=50000)), parent="orders",
               statuses=("requested", "approved", "rejected", "refunded"),
               transitions=(T("approve", "requested", "approved"), T("reject", "requested", "rejected"), T("refund", "approved", "refunded"))),
        Entity("reviews", "review", (F("rating", "int", low=1, high=5, editable=True), F("body", "sentence")), parent="products", creatable=True,
               statuses=("pending", "published", "hidden"), transitions=(T("publish", "pending", "published"), T("hide", "pending published", "hidden"))),
    )),
    Domain("travel", "Travel booking", ("travel", "flight", "hotel", "booking", "trip", "vacation", "airline", "rental", "stay", "itinerary", "kayak", "expedia", "airbnb"), (
        Entity("travelers", "traveler", (F("full_name", "name"), F("email", "email", editable=True), F("loyalty_level", "enum", "none", "silver", "gold", editable=True)), label="full_name"),
        Entity("properties", "property", (F("property_name", "company"), F("city", "city"), F("nightly_rate_cents", "money", low=4000, high=60000, editable=True)), label="property_name",
               statuses=("listed", "paused"), transitions=(T("pause", "listed", "paused", "pause the listing of"), T("relist", "paused", "listed"))),
        Entity("flights", "flight", (F("flight_code", "word"), F("origin", "city"), F("destination", "city"), F("departs_on", "date")), label="flight_code",
               statuses=("scheduled", "delayed", "cancelled"), transitions=(T("delay", "scheduled", "delayed"), T("cancel", "scheduled delayed", "cancelled"))),
        Entity("bookings", "booking", (F("check_in", "date", editable=True), F("nights", "int", low=1, high=14), F("total_cents", "money", low=5000, high=500000)), parent="travelers", extra_parent="properties", creatable=True,
               statuses=("held", "confirmed", "completed", "cancelled"), transitions=(T("confirm", "held", "confirmed"), T("complete", "confirmed", "completed", "mark as completed"), T("cancel", "held confirmed", "cancelled"))),
        Entity("seat_reservations", "seat reservation", (F("seat", "word"), F("fare_class", "enum", "economy", "premium", "business", editable=True)), parent="travelers", extra_parent="flights", creatable=True,
               statuses=("reserved", "checked_in", "released"), transitions=(T("check_in", "reserved", "checked_in", "check in"), T("release", "reserved", "released"))),
    )),
    Domain("banking", "Banking and payments", ("bank", "banking", "payment", "finance", "credit", "loan", "invest", "brokerage", "wallet", "crypto", "trading", "money", "account", "accounting", "invoice", "paypal", "stripe"), (
        Entity("clients", "client", (F("full_name", "name"), F("email", "email", editable=True), F("risk_profile", "enum", "low", "medium", "high", editable=True)), label="full_name"),
        Entity("accounts", "account", (F("account_number", "word"), F("kind", "enum", "checking", "savings", "brokerage"), F("balance_cents", "money", low=0, high=9000000)), parent="clients", label="account_number",
               statuses=("open", "frozen", "closed"), transitions=(T("freeze", "open", "frozen"), T("unfreeze", "frozen", "open"), T("close", "open", "closed"))),
        Entity("cards", "card", (F("last_four", "word"), F("limit_cents", "money", low=50000, high=2000000, editable=True)), parent="accounts", label="last_four",
               statuses=("active", "blocked", "expired"), transitions=(T("block", "active", "blocked"), T("unblock", "blocked", "active"))),
        Entity("transfers", "transfer", (F("amount_cents", "money", low=100, high=500000), F("memo", "sentence"), F("scheduled_on", "date", editable=True)), parent="accounts", creatable=True,
               statuses=("scheduled", "sent", "failed", "cancelled"), transitions=(T("send", "scheduled", "sent"), T("cancel", "scheduled", "cancelled"))),
        Entity("disputes", "dispute", (F("reason", "sentence"), F("amount_cents", "money", low=100, high=100000)), parent="cards", creatable=True,
               statuses=("open", "under_review", "won", "lost"), transitions=(T("review", "open", "under_review", "start reviewing"), T("resolve_won", "under_review", "won", "resolve in the customer's favour"), T("resolve_lost", "under_review", "lost", "resolve against the customer"))),
    )),
    Domain("clinic", "Clinic and pharmacy", ("clinic", "health", "doctor", "patient", "pharmacy", "medical", "hospital", "appointment", "prescription", "dental", "cvs"), (
        Entity("patients", "patient", (F("full_name", "name"), F("phone", "phone", editable=True), F("insurance", "enum", "none", "basic", "premium", editable=True)), label="full_name"),
        Entity("doctors", "doctor", (F("full_name", "name"), F("specialty", "enum", "family", "cardiology", "dermatology", "pediatrics")), label="full_name",
               statuses=("available", "on_leave"), transitions=(T("start_leave", "available", "on_leave", "put on leave"), T("end_leave", "on_leave", "available", "bring back from leave"))),
        Entity("appointments", "appointment", (F("scheduled_on", "date", editable=True), F("reason", "sentence")), parent="patients", extra_parent="doctors", creatable=True,
               statuses=("requested", "confirmed", "completed", "cancelled", "no_show"), transitions=(T("confirm", "requested", "confirmed"), T("complete", "confirmed", "completed", "mark as completed"), T("cancel", "requested confirmed", "cancelled"), T("mark_no_show", "confirmed", "no_show", "mark as a no-show"))),
        Entity("prescriptions", "prescription", (F("medication", "word"), F("dosage_mg", "int", low=5, high=500, editable=True), F("refills", "int", low=0, high=5)), parent="patients", creatable=True,
               statuses=("pending", "filled", "picked_up", "void"), transitions=(T("fill", "pending", "filled"), T("hand_out", "filled", "picked_up", "hand out"), T("void", "pending filled", "void"))),
        Entity("lab_results", "lab result", (F("test_name", "word"), F("value", "int", low=1, high=400)), parent="patients",
               statuses=("pending", "reviewed", "released"), transitions=(T("review", "pending", "reviewed"), T("release", "reviewed", "released"))),
    )),
    Domain("project_tracking", "Project tracking", ("project", "issue", "task", "ticket", "sprint", "repository", "code", "developer", "board", "kanban", "jira", "github", "gitlab", "trello", "basecamp", "workflow", "collaboration"), (
        Entity("members", "member", (F("full_name", "name"), F("email", "email", editable=True), F("role", "enum", "developer", "designer", "manager", editable=True)), label="full_name"),
        Entity("projects", "project", (F("project_name", "company"), F("description", "sentence", editable=True)), label="project_name",
               statuses=("active", "on_hold", "archived"), transitions=(T("hold", "active", "on_hold", "put on hold"), T("resume", "on_hold", "active"), T("archive", "active on_hold", "archived"))),
        Entity("issues", "issue", (F("title", "title"), F("priority", "enum", "low", "medium", "high", "urgent", editable=True), F("points", "int", low=1, high=13)), parent="projects", label="title", creatable=True,
               statuses=("open", "in_progress", "in_review", "done", "wont_fix"), transitions=(T("start", "open", "in_progress", "start work on"), T("submit", "in_progress", "in_review", "submit for review"), T("close", "in_review", "done"), T("reject", "open in_progress", "wont_fix", "mark as won't fix"))),
        Entity("pull_requests", "pull request", (F("branch", "word"), F("lines_changed", "int", low=1, high=2000)), parent="projects", extra_parent="members", creatable=True,
               statuses=("draft", "open", "merged", "closed"), transitions=(T("ready", "draft", "open", "mark ready for review"), T("merge", "open", "merged"), T("close", "draft open", "closed"))),
        Entity("sprints", "sprint", (F("sprint_name", "word"), F("starts_on", "date", editable=True)), parent="projects", label="sprint_name",
               statuses=("planned", "running", "finished"), transitions=(T("begin", "planned", "running", "begin"), T("finish", "running", "finished"))),
    )),
    Domain("social_media", "Social network", ("social", "post", "friend", "follow", "community", "feed", "share", "network", "forum", "question", "discussion", "message board", "review", "reddit", "twitter", "facebook", "instagram", "tiktok", "linkedin", "pinterest", "quora", "discord", "nextdoor", "yelp"), (
        Entity("users", "user", (F("handle", "word"), F("display_name", "name", editable=True), F("visibility", "enum", "public", "friends", "private", editable=True)), label="handle",
               statuses=("active", "suspended"), transitions=(T("suspend", "active", "suspended"), T("reinstate", "suspended", "active"))),
        Entity("groups", "group", (F("group_name", "company"), F("topic", "enum", "tech", "sports", "music", "food", "travel")), label="group_name"),
        Entity("posts", "post", (F("headline", "title"), F("body", "sentence", editable=True), F("likes", "int", low=0, high=5000)), parent="users", label="headline", creatable=True,
               statuses=("draft", "published", "flagged", "removed"), transitions=(T("publish", "draft", "published"), T("flag", "published", "flagged"), T("remove", "published flagged", "removed"), T("restore", "flagged", "published"))),
        Entity("comments", "comment", (F("body", "sentence", editable=True),), parent="posts", extra_parent="users", creatable=True,
               statuses=("visible", "hidden"), transitions=(T("hide", "visible", "hidden"), T("unhide", "hidden", "visible"))),
        Entity("memberships", "membership", (F("joined_on", "date"), F("role", "enum", "member", "moderator", editable=True)), parent="groups", extra_parent="users", creatable=True,
               statuses=("pending", "approved", "banned"), transitions=(T("approve", "pending", "approved"), T("ban", "pending approved", "banned"))),
    )),
    Domain("streaming", "Streaming service", ("stream", "video", "music", "movie", "tv", "show", "podcast", "watch", "listen", "playlist", "channel", "netflix", "spotify", "youtube", "hulu", "twitch", "peacock", "hbo", "imdb", "film"), (
        Entity("subscribers", "subscriber", (F("full_name", "name"), F("email", "email", editable=True), F("plan", "enum", "basic", "standard", "premium", editable=True)), label="full_name",
               statuses=("active", "paused", "cancelled"), transitions=(T("pause", "active", "paused", "pause the subscription of"), T("resume", "paused", "active"), T("cancel", "active paused", "cancelled"))),
        Entity("titles", "title", (F("title_name", "title"), F("genre", "enum", "drama", "comedy", "documentary", "thriller", "animation"), F("minutes", "int", low=20, high=180)), label="title_name",
               statuses=("available", "expiring", "removed"), transitions=(T("expire", "available", "expiring", "mark as expiring"), T("remove", "available expiring", "removed"))),
        Entity("playlists", "playlist", (F("playlist_name", "word"), F("description", "sentence", editable=True)), parent="subscribers", label="playlist_name", creatable=True,
               statuses=("private", "shared"), transitions=(T("share", "private", "shared"), T("unshare", "shared", "private"))),
        Entity("watch_sessions", "watch session", (F("watched_on", "date"), F("progress_pct", "int", low=0, high=100)), parent="subscribers", extra_parent="titles",
               statuses=("in_progress", "finished", "abandoned"), transitions=(T("finish", "in_progress", "finished", "mark as finished"), T("abandon", "in_progress", "abandoned"))),
        Entity("payments", "payment", (F("amount_cents", "money", low=499, high=2499), F("billed_on", "date")), parent="subscribers",
               statuses=("due", "paid", "refunded"), transitions=(T("collect", "due", "paid"), T("refund", "paid", "refunded"))),
    )),
    Domain("food_delivery", "Food delivery", ("food", "restaurant", "delivery", "meal", "grocery", "recipe", "dining", "kitchen", "menu", "takeout", "doordash", "grubhub", "instacart", "opentable", "eats"), (
        Entity("diners", "diner", (F("full_name", "name"), F("phone", "phone", editable=True), F("address", "address", editable=True)), label="full_name"),
        Entity("restaurants", "restaurant", (F("restaurant_name", "company"), F("cuisine", "enum", "italian", "thai", "mexican", "indian", "american")), label="restaurant_name",
               statuses=("open", "busy", "closed"), transitions=(T("mark_busy", "open", "busy", "mark as busy"), T("close", "open busy", "closed"), T("reopen", "closed busy", "open"))),
        Entity("menu_items", "menu item", (F("dish", "word"), F("price_cents", "money", low=300, high=4500, editable=True)), parent="restaurants", label="dish", creatable=True,
               statuses=("available", "sold_out"), transitions=(T("sell_out", "available", "sold_out", "mark as sold out"), T("restock", "sold_out", "available"))),
        Entity("deliveries", "delivery", (F("total_cents", "money", low=800, high=12000), F("tip_cents", "money", low=0, high=2000, editable=True)), parent="diners", extra_parent="restaurants", creatable=True,
               statuses=("placed", "preparing", "out_for_delivery", "delivered", "cancelled"), transitions=(T("accept", "placed", "preparing"), T("dispatch", "preparing", "out_for_delivery"), T("deliver", "out_for_delivery", "delivered", "mark as delivered"), T("cancel", "placed preparing", "cancelled"))),
        Entity("couriers", "courier", (F("full_name", "name"), F("vehicle", "enum", "bike", "scooter", "car")), label="full_name",
               statuses=("online", "offline"), transitions=(T("go_online", "offline", "online", "put online"), T("go_offline", "online", "offline", "take offline"))),
    )),
    Domain("real_estate", "Real estate", ("real estate", "home", "house", "rent", "property", "listing", "apartment", "mortgage", "realtor", "zillow", "redfin", "landlord", "tenant"), (
        Entity("agents", "agent", (F("full_name", "name"), F("phone", "phone", editable=True), F("brokerage", "company")), label="full_name"),
        Entity("listings", "listing", (F("street_address", "address"), F("city", "city"), F("price_cents", "money", low=10000000, high=200000000, editable=True), F("bedrooms", "int", low=1, high=6)), parent="agents", label="street_address",
               statuses=("coming_soon", "active", "pending", "sold", "withdrawn"), transitions=(T("activate", "coming_soon", "active"), T("mark_pending", "active", "pending", "mark as pending"), T("mark_sold", "pending", "sold", "mark as sold"), T("withdraw", "coming_soon active", "withdrawn"))),
        Entity("buyers", "buyer", (F("full_name", "name"), F("email", "email", editable=True), F("budget_cents", "money", low=10000000, high=300000000, editable=True)), label="full_name"),
        Entity("showings", "showing", (F("scheduled_on", "date", editable=True),), parent="listings", extra_parent="buyers", creatable=True,
               statuses=("requested", "confirmed", "done", "cancelled"), transitions=(T("confirm", "requested", "confirmed"), T("complete", "confirmed", "done", "mark as done"), T("cancel", "requested confirmed", "cancelled"))),
        Entity("offers", "offer", (F("amount_cents", "money", low=10000000, high=200000000), F("contingent", "bool")), parent="listings", extra_parent="buyers", creatable=True,
               statuses=("submitted", "countered", "accepted", "rejected"), transitions=(T("counter", "submitted", "countered"), T("accept", "submitted countered", "accepted"), T("reject", "submitted countered", "rejected"))),
    )),
    Domain("education", "Online learning", ("education", "course", "student", "school", "learn", "class", "teacher", "university", "lesson", "assignment", "canvas", "instructure", "quiz", "tutor"), (
        Entity("students", "student", (F("full_name", "name"), F("email", "email", editable=True), F("year", "int", low=1, high=4)), label="full_name",
               statuses=("enrolled", "on_leave", "graduated"), transitions=(T("take_leave", "enrolled", "on_leave", "put on leave"), T("return_from_leave", "on_leave", "enrolled", "bring back from leave"), T("graduate", "enrolled", "graduated"))),
        Entity("courses", "course", (F("course_title", "title"), F("credits", "int", low=1, high=6, editable=True)), label="course_title",
               statuses=("draft", "open", "closed"), transitions=(T("open_enrollment", "draft", "open", "open enrollment for"), T("close_enrollment", "open", "closed", "close enrollment for"))),
        Entity("enrollments", "enrollment", (F("enrolled_on", "date"), F("grade", "enum", "none", "A", "B", "C", "D", "F", editable=True)), parent="students", extra_parent="courses", creatable=True,
               statuses=("active", "dropped", "completed"), transitions=(T("drop", "active", "dropped"), T("complete", "active", "completed", "mark as completed"))),
        Entity("assignments", "assignment", (F("assignment_title", "title"), F("due_on", "date", editable=True), F("max_points", "int", low=10, high=100)), parent="courses", label="assignment_title", creatable=True,
               statuses=("draft", "published", "graded"), transitions=(T("publish", "draft", "published"), T("grade", "published", "graded", "mark as graded"))),
        Entity("submissions", "submission", (F("score", "int", low=0, high=100, editable=True),), parent="assignments", extra_parent="students",
               statuses=("submitted", "late", "graded", "returned"), transitions=(T("grade", "submitted late", "graded"), T("return_to_student", "graded", "returned", "return"))),
    )),
    Domain("hr", "Hiring and HR", ("job", "hiring", "recruit", "employee", "career", "candidate", "hr", "payroll", "resume", "interview", "indeed", "workforce", "crm", "sales", "salesforce", "lead"), (
        Entity("employees", "employee", (F("full_name", "name"), F("email", "email", editable=True), F("department", "enum", "engineering", "sales", "support", "finance", editable=True)), label="full_name",
               statuses=("active", "on_leave", "terminated"), transitions=(T("start_leave", "active", "on_leave", "put on leave"), T("end_leave", "on_leave", "active", "bring back from leave"), T("terminate", "active on_leave", "terminated"))),
        Entity("job_openings", "job opening", (F("job_title", "title"), F("salary_cents", "money", low=4000000, high=25000000, editable=True)), label="job_title",
               statuses=("draft", "open", "filled", "closed"), transitions=(T("post", "draft", "open"), T("fill", "open", "filled", "mark as filled"), T("close", "draft open", "closed"))),
        Entity("candidates", "candidate", (F("full_name", "name"), F("email", "email", editable=True), F("years_experience", "int", low=0, high=30)), label="full_name"),
        Entity("applications", "application", (F("applied_on", "date"), F("score", "int", low=0, high=100, editable=True)), parent="candidates", extra_parent="job_openings", creatable=True,
               statuses=("received", "screening", "interview", "offer", "hired", "rejected"), transitions=(T("screen", "received", "screening"), T("invite", "screening", "interview", "invite to interview"), T("make_offer", "interview", "offer", "make an offer on"), T("hire", "offer", "hired"), T("reject", "received screening interview", "rejected"))),
        Entity("time_off_requests", "time-off request", (F("starts_on", "date", editable=True), F("days", "int", low=1, high=20)), parent="employees", creatable=True,
               statuses=("pending", "approved", "denied"), transitions=(T("approve", "pending", "approved"), T("deny", "pending", "denied"))),
    )),
    Domain("support_desk", "Customer support desk", ("support", "help", "customer service", "telecom", "mobile", "internet", "cable", "phone", "carrier", "security", "identity", "login", "password", "xfinity", "t-mobile", "at&t", "okta", "duo"), (
        Entity("customers", "customer", (F("full_name", "name"), F("email", "email", editable=True), F("plan", "enum", "basic", "unlimited", "business", editable=True)), label="full_name",
               statuses=("active", "suspended", "closed"), transitions=(T("suspend", "active", "suspended"), T("reactivate", "suspended", "active"), T("close", "active suspended", "closed"))),
        Entity("agents", "agent", (F("full_name", "name"), F("team", "enum", "billing", "technical", "accounts")), label="full_name"),
        Entity("tickets", "ticket", (F("subject", "title"), F("priority", "enum", "low", "normal", "high", "urgent", editable=True)), parent="customers", extra_parent="agents", label="subject", creatable=True,
               statuses=("new", "open", "waiting", "solved", "closed"), transitions=(T("open", "new", "open"), T("wait", "open", "waiting", "set to waiting on the customer"), T("solve", "open waiting", "solved"), T("close", "solved", "closed"))),
        Entity("devices", "device", (F("serial", "word"), F("model", "enum", "phone", "router", "modem", "tablet")), parent="customers", label="serial",
               statuses=("active", "lost", "replaced"), transitions=(T("report_lost", "active", "lost", "report as lost"), T("replace", "active lost", "replaced"))),
        Entity("credits", "credit", (F("amount_cents", "money", low=100, high=20000), F("reason", "sentence")), parent="customers", creatable=True,
               statuses=("proposed", "applied", "revoked"), transitions=(T("apply", "proposed", "applied"), T("revoke", "proposed applied", "revoked"))),
    )),
    Domain("messaging", "Email and team messaging", ("email", "mail", "inbox", "chat", "message", "team", "meeting", "video call", "calendar", "office", "document", "slack", "zoom", "gmail", "outlook", "microsoft", "sharepoint", "proton"), (
        Entity("people", "person", (F("full_name", "name"), F("email", "email", editable=True), F("timezone", "enum", "UTC", "US/Eastern", "Europe/Berlin", "Asia/Tokyo", editable=True)), label="full_name"),
        Entity("channels", "channel", (F("channel_name", "word"), F("purpose", "sentence", editable=True)), label="channel_name",
               statuses=("active", "archived"), transitions=(T("archive", "active", "archived"), T("unarchive", "archived", "active"))),
        Entity("emails", "email", (F("subject", "title"), F("body", "sentence")), parent="people", label="subject",
               statuses=("unread", "read", "archived", "trashed"), transitions=(T("mark_read", "unread", "read", "mark as read"), T("archive", "unread read", "archived"), T("trash", "unread read archived", "trashed", "move to trash"))),
        Entity("meetings", "meeting", (F("title", "title"), F("scheduled_on", "date", editable=True), F("minutes", "int", low=15, high=120)), parent="people", label="title", creatable=True,
               statuses=("tentative", "confirmed", "cancelled"), transitions=(T("confirm", "tentative", "confirmed"), T("cancel", "tentative confirmed", "cancelled"))),
        Entity("messages", "message", (F("body", "sentence", editable=True),), parent="channels", extra_parent="people", creatable=True,
               statuses=("posted", "pinned", "deleted"), transitions=(T("pin", "posted", "pinned"), T("delete", "posted pinned", "deleted"))),
    )),
    Domain("logistics", "Shipping and logistics", ("shipping", "package", "parcel", "courier", "postal", "mail delivery", "logistics", "freight", "tracking", "usps", "fedex", "ups", "ride", "driver", "uber", "lyft"), (
        Entity("shippers", "shipper", (F("company_name", "company"), F("email", "email", editable=True)), label="company_name"),
        Entity("depots", "depot", (F("depot_name", "city"), F("capacity", "int", low=100, high=5000, editable=True)), label="depot_name",
               statuses=("open", "closed"), transitions=(T("close", "open", "closed"), T("reopen", "closed", "open"))),
        Entity("shipments", "shipment", (F("tracking_number", "word"), F("weight_grams", "int", low=50, high=30000), F("destination", "address", editable=True)), parent="shippers", extra_parent="depots", label="tracking_number", creatable=True,
               statuses=("label_created", "in_transit", "out_for_delivery", "delivered", "returned"), transitions=(T("pick_up", "label_created", "in_transit", "pick up"), T("dispatch", "in_transit", "out_for_delivery"), T("deliver", "out_for_delivery", "delivered", "mark as delivered"), T("return_to_sender", "in_transit out_for_delivery", "returned", "return to sender"))),
        Entity("drivers", "driver", (F("full_name", "name"), F("vehicle", "enum", "van", "truck", "bike")), label="full_name",
               statuses=("on_shift", "off_shift"), transitions=(T("start_shift", "off_shift", "on_shift", "start the shift of"), T("end_shift", "on_shift", "off_shift", "end the shift of"))),
        Entity("claims", "claim", (F("description", "sentence"), F("amount_cents", "money", low=500, high=100000)), parent="shipments", creatable=True,
               statuses=("filed", "approved", "denied", "paid"), transitions=(T("approve", "filed", "approved"), T("deny", "filed", "denied"), T("pay_out", "approved", "paid", "pay out"))),
    )),
    Domain("events", "Events and ticketing", ("event", "ticket", "concert", "venue", "schedule", "booking calendar", "appointment scheduling", "reservation", "ticketmaster", "calendly", "sports", "game", "tournament"), (
        Entity("attendees", "attendee", (F("full_name", "name"), F("email", "email", editable=True)), label="full_name"),
        Entity("venues", "venue", (F("venue_name", "company"), F("city", "city"), F("capacity", "int", low=100, high=20000, editable=True)), label="venue_name"),
        Entity("events", "event", (F("event_name", "title"), F("starts_on", "date", editable=True), F("price_cents", "money", low=1000, high=30000, editable=True)), parent="venues", label="event_name", creatable=True,
               statuses=("announced", "on_sale", "sold_out", "cancelled"), transitions=(T("start_sales", "announced", "on_sale", "start ticket sales for"), T("mark_sold_out", "on_sale", "sold_out", "mark as sold out"), T("cancel", "announced on_sale sold_out", "cancelled"))),
        Entity("tickets", "ticket", (F("seat", "word"), F("price_paid_cents", "money", low=1000, high=30000)), parent="events", extra_parent="attendees", creatable=True,
               statuses=("reserved", "issued", "scanned", "refunded"), transitions=(T("issue", "reserved", "issued"), T("scan", "issued", "scanned"), T("refund", "reserved issued", "refunded"))),
        Entity("waitlist_entries", "waitlist entry", (F("joined_on", "date"), F("party_size", "int", low=1, high=6, editable=True)), parent="events", extra_parent="attendees", creatable=True,
               statuses=("waiting", "offered", "expired"), transitions=(T("offer_seat", "waiting", "offered", "offer a seat to"), T("expire", "waiting offered", "expired"))),
    )),
)
