-- Invoices issued: one row per tenant and closed month, written once by the control plane
-- that leads webhook dispatch after the month's grace period, in the transaction that queues
-- the tenant's invoice.issued webhook event (so the event is sent exactly for the rows here).
-- `total_cents` is the total when issued; the invoice view still sums usage that arrives later
-- and shows both.
CREATE TABLE invoices_issued (
    tenant_id   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    period      TEXT NOT NULL,
    total_cents BIGINT NOT NULL,
    issued_at   TEXT NOT NULL,
    PRIMARY KEY (tenant_id, period)
);
