"""Tools of the retail store world.

Every tool takes the episode's database connection first (rows support both index and
column-name access). Business-rule refusals raise ToolError; the runtime commits a call's
writes only when the tool returns.
"""

from worldsmith.runtime import ToolError

ORDER_COLUMNS = "id, customer_id, status, shipping_address, coupon_code, subtotal_cents, discount_cents, points_redeemed, total_cents, created_at, cancellation_reason"


def _today(conn):
    return conn.execute("SELECT value FROM store_settings WHERE key = 'today'").fetchone()[0]


def _customer(conn, customer_id):
    row = conn.execute("SELECT * FROM customers WHERE id = ?", (customer_id,)).fetchone()
    if row is None:
        raise ToolError(f"customer {customer_id} does not exist")
    return row


def _order(conn, order_id):
    row = conn.execute(f"SELECT {ORDER_COLUMNS} FROM orders WHERE id = ?", (order_id,)).fetchone()
    if row is None:
        raise ToolError(f"order {order_id} does not exist")
    return row


def _product_by_sku(conn, sku):
    row = conn.execute("SELECT * FROM products WHERE sku = ?", (sku,)).fetchone()
    if row is None:
        raise ToolError(f"no product with SKU {sku!r}")
    return row


def _points_for(conn, customer_id, total_cents):
    tier = _customer(conn, customer_id)["tier"]
    multiplier = int(conn.execute("SELECT value FROM store_settings WHERE key = 'gold_multiplier'").fetchone()[0])
    points = total_cents // 100
    return points * multiplier if tier == "gold" else points


def _add_points(conn, customer_id, order_id, points, reason):
    conn.execute("UPDATE customers SET loyalty_points = loyalty_points + ? WHERE id = ?", (points, customer_id))
    conn.execute(
        "INSERT INTO loyalty_transactions (customer_id, order_id, points, reason, created_at) VALUES (?, ?, ?, ?, ?)",
        (customer_id, order_id, points, reason, _today(conn)),
    )


def find_customer(conn, email: str) -> dict:
    """Look up a customer by email address.

    Args:
        email: The customer's email address, e.g. "maria.lopez@example.com".
    """
    row = conn.execute("SELECT * FROM customers WHERE lower(email) = lower(?)", (email.strip(),)).fetchone()
    if row is None:
        raise ToolError(f"no customer with email {email!r}")
    return dict(row)


def get_customer(conn, customer_id: int) -> dict:
    """Get a customer's profile: name, email, tier and loyalty point balance.

    Args:
        customer_id: The customer's id.
    """
    return dict(_customer(conn, customer_id))


def search_products(conn, query: str = "", category: str | None = None, max_price_cents: int | None = None, include_inactive: bool = False) -> list:
    """Search the catalogue by name or SKU, optionally within a category and under a price.

    Args:
        query: Text to look for in the product name or SKU; empty matches everything.
        category: Only products of this category (peripherals, audio, displays, accessories).
        max_price_cents: Only products costing at most this many cents.
        include_inactive: Also list products no longer sold.
    """
    sql = "SELECT sku, name, category, price_cents, stock, active FROM products WHERE (name LIKE ? OR sku LIKE ?)"
    params = [f"%{query}%", f"%{query}%"]
    if category is not None:
        sql += " AND category = ?"
        params.append(category)
    if max_price_cents is not None:
        sql += " AND price_cents <= ?"
        params.append(max_price_cents)
    if not include_inactive:
        sql += " AND active = 1"
    return [dict(r) for r in conn.execute(sql + " ORDER BY price_cents, sku", params)]


def get_product(conn, sku: str) -> dict:
    """Get one product by SKU, with its price and stock.

    Args:
        sku: The product's SKU, e.g. "KB-101".
    """
    return dict(_product_by_sku(conn, sku))


def list_orders(conn, customer_id: int, status: str | None = None) -> list:
    """List a customer's orders, newest first.

    Args:
        customer_id: The customer's id.
        status: Only orders in this status (pending, paid, shipped, delivered, cancelled).
    """
    _customer(conn, customer_id)
    sql = f"SELECT {ORDER_COLUMNS} FROM orders WHERE customer_id = ?"
    params: list = [customer_id]
    if status is not None:
        sql += " AND status = ?"
        params.append(status)
    return [dict(r) for r in conn.execute(sql + " ORDER BY created_at DESC, id DESC", params)]


def get_order(conn, order_id: int) -> dict:
    """Get an order with its line items.

    Args:
        order_id: The order's id.
    """
    order = dict(_order(conn, order_id))
    order["items"] = [
        dict(r)
        for r in conn.execute(
            "SELECT oi.id AS item_id, p.sku, p.name, oi.quantity, oi.unit_price_cents "
            "FROM order_items oi JOIN products p ON p.id = oi.product_id WHERE oi.order_id = ? ORDER BY oi.id",
            (order_id,),
        )
    ]
    return order


def get_loyalty_history(conn, customer_id: int, limit: int = 10) -> dict:
    """Get a customer's loyalty point balance and latest point transactions.

    Args:
        customer_id: The customer's id.
        limit: How many transactions to return, newest first (1-50).
    """
    if not 1 <= limit <= 50:
        raise ToolError("limit must be between 1 and 50")
    customer = _customer(conn, customer_id)
    rows = conn.execute(
        "SELECT order_id, points, reason, created_at FROM loyalty_transactions WHERE customer_id = ? ORDER BY id DESC LIMIT ?",
        (customer_id, limit),
    )
    return {"customer_id": customer_id, "balance": customer["loyalty_points"], "transactions": [dict(r) for r in rows]}


def create_order(conn, customer_id: int, items: list[dict], shipping_address: str, coupon_code: str | None = None) -> dict:
    """Place a new pending order. Stock is reserved immediately.

    Args:
        customer_id: The customer's id.
        items: Line items, each {"sku": str, "quantity": int}; a SKU may appear once.
        shipping_address: Where to ship the order.
        coupon_code: Optional coupon code to apply, e.g. "SAVE10".
    """
    _customer(conn, customer_id)
    if not items:
        raise ToolError("an order needs at least one item")
    if not shipping_address.strip():
        raise ToolError("shipping_address must not be empty")
    lines = []
    seen = set()
    for item in items:
        sku, quantity = item.get("sku"), item.get("quantity")
        if not isinstance(sku, str) or not isinstance(quantity, int) or quantity < 1:
            raise ToolError(f"bad item {item!r}: need a SKU string and a quantity of at least 1")
        if sku in seen:
            raise ToolError(f"SKU {sku} appears twice; combine the quantities")
        seen.add(sku)
        product = _product_by_sku(conn, sku)
        if not product["active"]:
            raise ToolError(f"{sku} ({product['name']}) is no longer sold")
        if product["stock"] < quantity:
            raise ToolError(f"only {product['stock']} of {sku} in stock, {quantity} requested")
        lines.append((product, quantity))
    subtotal = sum(p["price_cents"] * q for p, q in lines)
    discount = 0
    if coupon_code is not None:
        coupon = conn.execute("SELECT * FROM coupons WHERE code = ?", (coupon_code,)).fetchone()
        if coupon is None or not coupon["active"]:
            raise ToolError(f"coupon {coupon_code!r} is not valid")
        if subtotal < coupon["min_total_cents"]:
            raise ToolError(f"coupon {coupon_code} needs a subtotal of at least {coupon['min_total_cents']} cents")
        discount = subtotal * coupon["percent_off"] // 100
    cursor = conn.execute(
        "INSERT INTO orders (customer_id, status, shipping_address, coupon_code, subtotal_cents, discount_cents, total_cents, created_at) "
        "VALUES (?, 'pending', ?, ?, ?, ?, ?, ?)",
        (customer_id, shipping_address.strip(), coupon_code, subtotal, discount, subtotal - discount, _today(conn)),
    )
    order_id = cursor.lastrowid
    for product, quantity in lines:
        conn.execute(
            "INSERT INTO order_items (order_id, product_id, quantity, unit_price_cents) VALUES (?, ?, ?, ?)",
            (order_id, product["id"], quantity, product["price_cents"]),
        )
        conn.execute("UPDATE products SET stock = stock - ? WHERE id = ?", (quantity, product["id"]))
    return get_order(conn, order_id)


def redeem_points(conn, order_id: int, points: int) -> dict:
    """Pay part of a pending order with loyalty points (1 point = 1 cent).

    Args:
        order_id: The pending order to discount.
        points: How many points to redeem; at most the balance and the order total.
    """
    order = _order(conn, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}; points can only be redeemed on pending orders")
    if points < 1:
        raise ToolError("points must be positive")
    balance = _customer(conn, order["customer_id"])["loyalty_points"]
    if points > balance:
        raise ToolError(f"customer has only {balance} points")
    if points > order["total_cents"]:
        raise ToolError(f"order total is only {order['total_cents']} cents")
    conn.execute(
        "UPDATE orders SET points_redeemed = points_redeemed + ?, total_cents = total_cents - ? WHERE id = ?",
        (points, points, order_id),
    )
    _add_points(conn, order["customer_id"], order_id, -points, "redemption")
    return get_order(conn, order_id)


def pay_order(conn, order_id: int) -> dict:
    """Charge a pending order; the customer earns loyalty points (1 per dollar, doubled for gold tier).

    Args:
        order_id: The pending order to pay.
    """
    order = _order(conn, order_id)
    if order["status"] != "pending":
        raise ToolError(f"order {order_id} is {order['status']}, not pending")
    conn.execute("UPDATE orders SET status = 'paid' WHERE id = ?", (order_id,))
    earned = _points_for(conn, order["customer_id"], order["total_cents"])
    if earned:
        _add_points(conn, order["customer_id"], order_id, earned, "purchase")
    result = get_order(conn, order_id)
    result["points_earned"] = earned
    return result


def ship_order(conn, order_id: int) -> dict:
    """Mark a paid order as shipped.

    Args:
        order_id: The paid order to ship.
    """
    order = _order(conn, order_id)
    if order["status"] != "paid":
        raise ToolError(f"order {order_id} is {order['status']}; only paid orders can be shipped")
    conn.execute("UPDATE orders SET status = 'shipped' WHERE id = ?", (order_id,))
    return get_order(conn, order_id)


def cancel_order(conn, order_id: int, reason: str) -> dict:
    """Cancel an order that has not shipped: stock is restocked, redeemed points refunded, earned points taken back.

    Args:
        order_id: The order to cancel.
        reason: Why the order is cancelled.
    """
    order = _order(conn, order_id)
    if order["status"] not in ("pending", "paid"):
        raise ToolError(f"order {order_id} is {order['status']} and can no longer be cancelled")
    if not reason.strip():
        raise ToolError("a cancellation reason is required")
    for item in conn.execute("SELECT product_id, quantity FROM order_items WHERE order_id = ?", (order_id,)).fetchall():
        conn.execute("UPDATE products SET stock = stock + ? WHERE id = ?", (item["quantity"], item["product_id"]))
    net = conn.execute(
        "SELECT COALESCE(SUM(points), 0) FROM loyalty_transactions WHERE order_id = ?", (order_id,)
    ).fetchone()[0]
    if net:
        balance = _customer(conn, order["customer_id"])["loyalty_points"]
        _add_points(conn, order["customer_id"], order_id, -min(net, balance), "cancellation")
    conn.execute("UPDATE orders SET status = 'cancelled', cancellation_reason = ? WHERE id = ?", (reason.strip(), order_id))
    return get_order(conn, order_id)


def update_shipping_address(conn, order_id: int, shipping_address: str) -> dict:
    """Change where an order ships, before it has shipped.

    Args:
        order_id: The order to change.
        shipping_address: The new address.
    """
    order = _order(conn, order_id)
    if order["status"] not in ("pending", "paid"):
        raise ToolError(f"order {order_id} is {order['status']}; its address can no longer change")
    if not shipping_address.strip():
        raise ToolError("shipping_address must not be empty")
    conn.execute("UPDATE orders SET shipping_address = ? WHERE id = ?", (shipping_address.strip(), order_id))
    return get_order(conn, order_id)


def request_return(conn, order_id: int, sku: str, quantity: int, reason: str) -> dict:
    """Open a return for items of a delivered order.

    Args:
        order_id: The delivered order.
        sku: SKU of the item to return.
        quantity: How many units to return.
        reason: Why the customer returns them.
    """
    order = _order(conn, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be returned")
    item = conn.execute(
        "SELECT oi.id, oi.quantity FROM order_items oi JOIN products p ON p.id = oi.product_id WHERE oi.order_id = ? AND p.sku = ?",
        (order_id, sku),
    ).fetchone()
    if item is None:
        raise ToolError(f"order {order_id} has no item {sku}")
    returned = conn.execute(
        "SELECT COALESCE(SUM(quantity), 0) FROM returns WHERE order_item_id = ? AND status != 'rejected'", (item["id"],)
    ).fetchone()[0]
    if quantity < 1 or quantity > item["quantity"] - returned:
        raise ToolError(f"can return at most {item['quantity'] - returned} of {sku} from order {order_id}")
    if not reason.strip():
        raise ToolError("a return reason is required")
    cursor = conn.execute(
        "INSERT INTO returns (order_item_id, quantity, reason, status, created_at) VALUES (?, ?, ?, 'requested', ?)",
        (item["id"], quantity, reason.strip(), _today(conn)),
    )
    return dict(conn.execute("SELECT * FROM returns WHERE id = ?", (cursor.lastrowid,)).fetchone())


def update_customer_email(conn, customer_id: int, email: str) -> dict:
    """Change a customer's email address.

    Args:
        customer_id: The customer's id.
        email: The new email address; must not belong to another customer.
    """
    _customer(conn, customer_id)
    email = email.strip().lower()
    if "@" not in email or email.startswith("@") or email.endswith("@"):
        raise ToolError(f"{email!r} is not an email address")
    taken = conn.execute("SELECT id FROM customers WHERE email = ? AND id != ?", (email, customer_id)).fetchone()
    if taken is not None:
        raise ToolError(f"{email} already belongs to another customer")
    conn.execute("UPDATE customers SET email = ? WHERE id = ?", (email, customer_id))
    return dict(_customer(conn, customer_id))


def add_review(conn, customer_id: int, sku: str, rating: int, body: str) -> dict:
    """Post a customer's review of a product they have received.

    Args:
        customer_id: The reviewing customer.
        sku: The product's SKU.
        rating: Stars from 1 to 5.
        body: The review text.
    """
    _customer(conn, customer_id)
    product = _product_by_sku(conn, sku)
    if not 1 <= rating <= 5:
        raise ToolError("rating must be between 1 and 5")
    received = conn.execute(
        "SELECT 1 FROM orders o JOIN order_items oi ON oi.order_id = o.id "
        "WHERE o.customer_id = ? AND oi.product_id = ? AND o.status = 'delivered'",
        (customer_id, product["id"]),
    ).fetchone()
    if received is None:
        raise ToolError(f"customer {customer_id} has not received {sku} and cannot review it")
    if conn.execute("SELECT 1 FROM reviews WHERE customer_id = ? AND product_id = ?", (customer_id, product["id"])).fetchone():
        raise ToolError(f"customer {customer_id} already reviewed {sku}")
    cursor = conn.execute(
        "INSERT INTO reviews (product_id, customer_id, rating, body, created_at) VALUES (?, ?, ?, ?, ?)",
        (product["id"], customer_id, rating, body.strip(), _today(conn)),
    )
    return dict(conn.execute("SELECT * FROM reviews WHERE id = ?", (cursor.lastrowid,)).fetchone())
