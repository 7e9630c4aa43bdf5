// Roles as the API orders them, and what each may do in the console.

import type { components } from './api/schema';

/** A role from the API. */
export type Role = components['schemas']['Role'];

/** Lowest to highest: each role can do everything below it. */
export const ROLES: readonly Role[] = ['inference', 'viewer', 'deployer', 'tenant-admin', 'platform-admin'];

/** Whether `role` is at least `needed`. */
export function atLeast(role: Role, needed: Role): boolean {
  return ROLES.indexOf(role) >= ROLES.indexOf(needed);
}

/** What the console shows or enables for a role. */
export interface Abilities {
  read: boolean;
  moveAliases: boolean;
  readAudit: boolean;
  platform: boolean;
}

/** The abilities of a role (the API enforces them; the console only hides and disables). */
export function abilitiesOf(role: Role): Abilities {
  return {
    read: atLeast(role, 'viewer'),
    moveAliases: atLeast(role, 'deployer'),
    readAudit: atLeast(role, 'tenant-admin'),
    platform: role === 'platform-admin',
  };
}
