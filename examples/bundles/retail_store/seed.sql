INSERT INTO store_settings (key, value) VALUES ('today', '2026-03-15'), ('points_per_dollar', '1'), ('gold_multiplier', '2');

INSERT INTO customers (id, name, email, tier, loyalty_points, created_at) VALUES
    (1, 'Maria Lopez',   'maria.lopez@example.com',  'gold',   1250, '2023-05-02'),
    (2, 'James Chen',    'james.chen@example.com',   'silver',  340, '2024-01-17'),
    (3, 'Sofia Rossi',   'sofia.rossi@example.com',  'silver',  800, '2024-06-30'),
    (4, 'Liam Walsh',    'liam.walsh@example.com',   'bronze',  120, '2025-02-11'),
    (5, 'Noah Okafor',   'noah.okafor@example.com',  'bronze',    0, '2025-09-05'),
    (6, 'Emma Wright',   'emma.wright@example.com',  'gold',    610, '2022-11-23'),
    (7, 'Aiko Tanaka',   'aiko.tanaka@example.com',  'silver',  275, '2024-12-01'),
    (8, 'Omar Haddad',   'omar.haddad@example.com',  'bronze',   45, '2026-01-08');

INSERT INTO products (id, sku, name, category, price_cents, stock, active) VALUES
    (1,  'KB-101', 'Mechanical Keyboard',        'peripherals', 8999, 25, 1),
    (2,  'MS-220', 'Wireless Mouse',             'peripherals', 2999, 40, 1),
    (3,  'HD-330', 'Noise-Cancelling Headphones','audio',      19999, 12, 1),
    (4,  'SP-410', 'Bluetooth Speaker',          'audio',       4999, 18, 1),
    (5,  'EB-150', 'Wireless Earbuds',           'audio',       7999,  0, 1),
    (6,  'MN-500', '27-inch Monitor',            'displays',   27999,  7, 1),
    (7,  'MN-510', '32-inch 4K Monitor',         'displays',   44999,  3, 1),
    (8,  'CB-020', 'USB-C Cable 2m',             'accessories', 1299, 150, 1),
    (9,  'HB-700', 'USB-C Hub',                  'accessories', 3999, 30, 1),
    (10, 'WC-900', 'HD Webcam',                  'peripherals', 5999,  9, 1),
    (11, 'LS-050', 'Laptop Stand',               'accessories', 3499, 22, 1),
    (12, 'SP-400', 'Portable Speaker (old)',     'audio',       2499,  5, 0),
    (13, 'MC-610', 'USB Microphone',             'audio',       6999, 11, 1),
    (14, 'DK-800', 'Docking Station',            'accessories',14999,  4, 1),
    (15, 'PD-120', 'Mouse Pad XL',               'peripherals', 1999, 60, 1);

INSERT INTO coupons (code, percent_off, min_total_cents, active) VALUES
    ('SAVE10',   10,     0, 1),
    ('BIG20',    20, 30000, 1),
    ('SPRING15', 15,     0, 0);

INSERT INTO orders (id, customer_id, status, shipping_address, coupon_code, subtotal_cents, discount_cents, points_redeemed, total_cents, created_at, cancellation_reason) VALUES
    (1001, 1, 'delivered', '4 Calle Mayor, Madrid',      NULL,     19999,    0,   0, 19999, '2026-01-10', NULL),
    (1002, 6, 'delivered', '88 Elm Road, Bristol',       NULL,     19999,    0,   0, 19999, '2026-02-02', NULL),
    (1003, 2, 'shipped',   '12 Harbour St, Leeds',       NULL,      8999,    0,   0,  8999, '2026-03-01', NULL),
    (1004, 3, 'pending',   '7 Via Roma, Turin',          NULL,      9297,    0,   0,  9297, '2026-03-12', NULL),
    (1005, 4, 'paid',      '19 Quay Lane, Cork',         NULL,      5999,    0,   0,  5999, '2026-03-13', NULL),
    (1006, 4, 'paid',      '19 Quay Lane, Cork',         'SAVE10',  3999,  400,   0,  3599, '2026-03-14', NULL),
    (1007, 7, 'pending',   '3-2-1 Shibuya, Tokyo',       NULL,      6999,    0,   0,  6999, '2026-03-14', NULL),
    (1008, 5, 'cancelled', '50 Market St, Lagos',        NULL,      2999,    0,   0,  2999, '2026-02-20', 'customer request'),
    (1009, 3, 'pending',   '7 Via Roma, Turin',          NULL,     27999,    0,   0, 27999, '2026-03-14', NULL),
    (1010, 8, 'delivered', '21 Cedar Ave, Amman',        NULL,      1299,    0,   0,  1299, '2026-02-25', NULL),
    (1011, 1, 'paid',      '4 Calle Mayor, Madrid',      NULL,      4999,    0,   0,  4999, '2026-03-14', NULL),
    (1012, 2, 'delivered', '12 Harbour St, Leeds',       NULL,      5998,    0,   0,  5998, '2026-02-14', NULL);

INSERT INTO order_items (id, order_id, product_id, quantity, unit_price_cents) VALUES
    (1,  1001, 3,  1, 19999),
    (2,  1002, 3,  1, 19999),
    (3,  1003, 1,  1,  8999),
    (4,  1004, 4,  1,  4999),
    (5,  1004, 2,  1,  2999),
    (6,  1004, 8,  1,  1299),
    (7,  1005, 10, 1,  5999),
    (8,  1006, 9,  1,  3999),
    (9,  1007, 13, 1,  6999),
    (10, 1008, 2,  1,  2999),
    (11, 1009, 6,  1, 27999),
    (12, 1010, 8,  1,  1299),
    (13, 1011, 4,  1,  4999),
    (14, 1012, 2,  2,  2999);

INSERT INTO returns (id, order_item_id, quantity, reason, status, created_at) VALUES
    (1, 12, 1, 'arrived damaged', 'refunded', '2026-03-01');

INSERT INTO loyalty_transactions (id, customer_id, order_id, points, reason, created_at) VALUES
    (1, 1, 1001,  399, 'purchase',   '2026-01-10'),
    (2, 6, 1002,  399, 'purchase',   '2026-02-02'),
    (3, 2, 1003,   89, 'purchase',   '2026-03-01'),
    (4, 4, 1005,   59, 'purchase',   '2026-03-13'),
    (5, 4, 1006,   35, 'purchase',   '2026-03-14'),
    (6, 1, 1011,   99, 'purchase',   '2026-03-14'),
    (7, 3, NULL,  200, 'adjustment', '2026-02-01'),
    (8, 2, 1012,   59, 'purchase',   '2026-02-14');

INSERT INTO reviews (id, product_id, customer_id, rating, body, created_at) VALUES
    (1, 3, 1, 5, 'Best headphones I have owned.', '2026-01-20'),
    (2, 8, 8, 2, 'Cable frayed within a week.',   '2026-02-28');
