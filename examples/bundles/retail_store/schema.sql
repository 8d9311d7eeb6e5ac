-- Retail store: customers, catalogue, orders, returns, loyalty points, coupons, reviews.
CREATE TABLE store_settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE customers (
    id             INTEGER PRIMARY KEY,
    name           TEXT NOT NULL,
    email          TEXT NOT NULL UNIQUE,
    tier           TEXT NOT NULL DEFAULT 'bronze' CHECK (tier IN ('bronze', 'silver', 'gold')),
    loyalty_points INTEGER NOT NULL DEFAULT 0 CHECK (loyalty_points >= 0),
    created_at     TEXT NOT NULL
);

CREATE TABLE products (
    id          INTEGER PRIMARY KEY,
    sku         TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    category    TEXT NOT NULL,
    price_cents INTEGER NOT NULL CHECK (price_cents > 0),
    stock       INTEGER NOT NULL CHECK (stock >= 0),
    active      INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1))
);

CREATE TABLE coupons (
    code            TEXT PRIMARY KEY,
    percent_off     INTEGER NOT NULL CHECK (percent_off BETWEEN 1 AND 90),
    min_total_cents INTEGER NOT NULL DEFAULT 0,
    active          INTEGER NOT NULL DEFAULT 1 CHECK (active IN (0, 1))
);

CREATE TABLE orders (
    id                    INTEGER PRIMARY KEY,
    customer_id           INTEGER NOT NULL REFERENCES customers(id),
    status                TEXT NOT NULL CHECK (status IN ('pending', 'paid', 'shipped', 'delivered', 'cancelled')),
    shipping_address      TEXT NOT NULL,
    coupon_code           TEXT REFERENCES coupons(code),
    subtotal_cents        INTEGER NOT NULL CHECK (subtotal_cents >= 0),
    discount_cents        INTEGER NOT NULL DEFAULT 0 CHECK (discount_cents >= 0),
    points_redeemed       INTEGER NOT NULL DEFAULT 0 CHECK (points_redeemed >= 0),
    total_cents           INTEGER NOT NULL CHECK (total_cents >= 0),
    created_at            TEXT NOT NULL,
    cancellation_reason   TEXT
);

CREATE TABLE order_items (
    id               INTEGER PRIMARY KEY,
    order_id         INTEGER NOT NULL REFERENCES orders(id),
    product_id       INTEGER NOT NULL REFERENCES products(id),
    quantity         INTEGER NOT NULL CHECK (quantity > 0),
    unit_price_cents INTEGER NOT NULL CHECK (unit_price_cents > 0),
    UNIQUE (order_id, product_id)
);

CREATE TABLE returns (
    id            INTEGER PRIMARY KEY,
    order_item_id INTEGER NOT NULL REFERENCES order_items(id),
    quantity      INTEGER NOT NULL CHECK (quantity > 0),
    reason        TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('requested', 'approved', 'rejected', 'refunded')),
    created_at    TEXT NOT NULL
);

CREATE TABLE loyalty_transactions (
    id          INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    order_id    INTEGER REFERENCES orders(id),
    points      INTEGER NOT NULL,
    reason      TEXT NOT NULL CHECK (reason IN ('purchase', 'redemption', 'cancellation', 'adjustment')),
    created_at  TEXT NOT NULL
);

CREATE TABLE reviews (
    id          INTEGER PRIMARY KEY,
    product_id  INTEGER NOT NULL REFERENCES products(id),
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    rating      INTEGER NOT NULL CHECK (rating BETWEEN 1 AND 5),
    body        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    UNIQUE (product_id, customer_id)
);

CREATE INDEX idx_orders_customer ON orders(customer_id);
CREATE INDEX idx_order_items_order ON order_items(order_id);
CREATE INDEX idx_loyalty_customer ON loyalty_transactions(customer_id);
CREATE INDEX idx_products_category ON products(category);
