"""Verifiers of the retail store tasks.

Each `verify_<task>(initial, final, answer)` reads the read-only databases before and after
the episode (rows support column-name access) and the agent's final message, and returns
{"status": "complete" | "partial" | "incomplete", "evidence": {...}}.
"""


def _result(verdict, **evidence):
    return {"status": verdict, "evidence": evidence}


def _new_orders(initial, final, customer_id):
    before = {r["id"] for r in initial.execute("SELECT id FROM orders WHERE customer_id = ?", (customer_id,))}
    return [dict(r) for r in final.execute("SELECT * FROM orders WHERE customer_id = ? ORDER BY id", (customer_id,)) if r["id"] not in before]


def _items(conn, order_id):
    rows = conn.execute(
        "SELECT p.sku, oi.quantity FROM order_items oi JOIN products p ON p.id = oi.product_id WHERE oi.order_id = ?",
        (order_id,),
    )
    return {r["sku"]: r["quantity"] for r in rows}


def _order(conn, order_id):
    row = conn.execute("SELECT * FROM orders WHERE id = ?", (order_id,)).fetchone()
    return dict(row) if row else None


def _dump(conn):
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY rowid').fetchall() for t in tables}


def _unchanged(initial, final):
    a, b = _dump(initial), _dump(final)
    return [t for t in a if [tuple(r) for r in a[t]] != [tuple(r) for r in b.get(t, [])]]


def verify_t01_points_balance(initial, final, answer):
    balance = initial.execute("SELECT loyalty_points FROM customers WHERE email = 'maria.lopez@example.com'").fetchone()[0]
    changed = _unchanged(initial, final)
    said = str(balance) in (answer or "").replace(",", "")
    if said and not changed:
        return _result("complete", expected=balance)
    if said:
        return _result("partial", expected=balance, changed_tables=changed)
    return _result("incomplete", expected=balance, answer=answer)


def verify_t02_place_and_pay(initial, final, answer):
    orders = _new_orders(initial, final, 2)
    if not orders:
        return _result("incomplete", reason="no new order for James Chen")
    wanted = {"KB-101": 2, "MS-220": 1}
    best = orders[-1]
    items = _items(final, best["id"])
    evidence = {"order_id": best["id"], "items": items, "status": best["status"], "address": best["shipping_address"], "new_orders": len(orders)}
    right_items = items == wanted
    right_address = "harbour st" in best["shipping_address"].lower() and "leeds" in best["shipping_address"].lower()
    if len(orders) == 1 and right_items and right_address and best["status"] == "paid":
        return _result("complete", **evidence)
    if set(items) & set(wanted):
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)


def verify_t03_cancel_and_readdress(initial, final, answer):
    cancelled = _order(final, 1004)
    moved = _order(final, 1009)
    did_cancel = cancelled["status"] == "cancelled" and "mistake" in (cancelled["cancellation_reason"] or "").lower()
    did_move = "corso francia" in moved["shipping_address"].lower() and moved["status"] == "pending"
    evidence = {"order_1004": cancelled["status"], "order_1009_address": moved["shipping_address"]}
    if did_cancel and did_move:
        return _result("complete", **evidence)
    if did_cancel or did_move:
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)


def verify_t04_return_headphones(initial, final, answer):
    before = {r["id"] for r in initial.execute("SELECT id FROM returns")}
    rows = [
        dict(r)
        for r in final.execute(
            "SELECT r.* FROM returns r JOIN order_items oi ON oi.id = r.order_item_id "
            "JOIN products p ON p.id = oi.product_id WHERE oi.order_id = 1002 AND p.sku = 'HD-330'"
        )
        if r["id"] not in before
    ]
    if len(rows) == 1 and rows[0]["quantity"] == 1 and "defect" in rows[0]["reason"].lower() and rows[0]["status"] == "requested":
        return _result("complete", ret=rows[0])
    if rows:
        return _result("partial", returns=rows)
    return _result("incomplete", reason="no new return for order 1002")


def verify_t05_ship_paid_orders(initial, final, answer):
    targets = [1005, 1006]
    shipped = [o for o in targets if _order(final, o)["status"] == "shipped"]
    others = [
        r["id"]
        for r in final.execute("SELECT id, status FROM orders WHERE id NOT IN (1005, 1006)")
        if r["status"] != _order(initial, r["id"])["status"]
    ]
    evidence = {"shipped": shipped, "other_orders_changed": others}
    if len(shipped) == 2 and not others:
        return _result("complete", **evidence)
    if shipped:
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)


def verify_t06_redeem_then_pay(initial, final, answer):
    order = _order(final, 1009)
    redeemed = order["points_redeemed"] == 500
    paid = order["status"] == "paid"
    balance = final.execute("SELECT loyalty_points FROM customers WHERE id = 3").fetchone()[0]
    evidence = {"points_redeemed": order["points_redeemed"], "status": order["status"], "total_cents": order["total_cents"], "balance": balance}
    if redeemed and paid:
        return _result("complete", **evidence)
    if redeemed or paid:
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)


def verify_t07_cheapest_audio(initial, final, answer):
    row = initial.execute(
        "SELECT sku FROM products WHERE category = 'audio' AND active = 1 ORDER BY price_cents LIMIT 1"
    ).fetchone()
    text = (answer or "").upper()
    said = row["sku"] in text and "SP-400" not in text
    changed = _unchanged(initial, final)
    if said and not changed:
        return _result("complete", expected=row["sku"])
    if said:
        return _result("partial", expected=row["sku"], changed_tables=changed)
    return _result("incomplete", expected=row["sku"], answer=answer)


def verify_t08_coupon_order(initial, final, answer):
    orders = _new_orders(initial, final, 5)
    if not orders:
        return _result("incomplete", reason="no new order for Noah Okafor")
    order = orders[-1]
    items = _items(final, order["id"])
    evidence = {"order_id": order["id"], "items": items, "coupon": order["coupon_code"], "total_cents": order["total_cents"], "status": order["status"], "address": order["shipping_address"]}
    right_address = "market st" in order["shipping_address"].lower() and "lagos" in order["shipping_address"].lower()
    if len(orders) == 1 and items == {"MN-500": 1} and order["coupon_code"] == "SAVE10" and order["total_cents"] == 25200 and right_address and order["status"] == "paid":
        return _result("complete", **evidence)
    if "MN-500" in items:
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)


def verify_t09_email_and_review(initial, final, answer):
    email = final.execute("SELECT email FROM customers WHERE id = 6").fetchone()[0]
    review = final.execute(
        "SELECT r.rating, r.body FROM reviews r JOIN products p ON p.id = r.product_id WHERE r.customer_id = 6 AND p.sku = 'HD-330'"
    ).fetchone()
    email_done = email == "emma.w@newmail.com"
    review_done = review is not None and review["rating"] == 5 and "great sound" in review["body"].lower()
    evidence = {"email": email, "review": dict(review) if review else None}
    if email_done and review_done:
        return _result("complete", **evidence)
    if email_done or review_done:
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)


def verify_t10_points_order(initial, final, answer):
    orders = _new_orders(initial, final, 2)
    if not orders:
        return _result("incomplete", reason="no new order for James Chen")
    order = orders[-1]
    items = _items(final, order["id"])
    evidence = {"order_id": order["id"], "items": items, "points_redeemed": order["points_redeemed"], "status": order["status"], "address": order["shipping_address"]}
    right_address = "harbour st" in order["shipping_address"].lower() and "leeds" in order["shipping_address"].lower()
    if len(orders) == 1 and items == {"MS-220": 3, "WC-900": 1} and order["points_redeemed"] == 340 and right_address and order["status"] == "paid":
        return _result("complete", **evidence)
    if set(items) & {"MS-220", "WC-900"}:
        return _result("partial", **evidence)
    return _result("incomplete", **evidence)
